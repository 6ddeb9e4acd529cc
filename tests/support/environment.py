"""Process environments the tests start kame in."""

#: What Kubernetes injects into every pod of a namespace with a Service named ``kame``.
K8S_SERVICE_LINKS = {
    "KAME_SERVICE_HOST": "10.0.0.1",
    "KAME_SERVICE_PORT": "8998",
    "KAME_SERVICE_PORT_HTTP": "8998",
    "KAME_PORT": "tcp://10.0.0.1:8998",
    "KAME_PORT_8998_TCP": "tcp://10.0.0.1:8998",
    "KAME_PORT_8998_TCP_PROTO": "tcp",
    "KAME_PORT_8998_TCP_PORT": "8998",
    "KAME_PORT_8998_TCP_ADDR": "10.0.0.1",
}
