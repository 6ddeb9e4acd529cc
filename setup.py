"""Package discovery for the mapped folders (the rest of the metadata is in pyproject.toml).

setuptools' ``packages.find`` finds packages under their folder names; server/, client/ and
configs/ ship as kame.server, kame.client and kame.configs (``package-dir`` in pyproject.toml),
so their subpackages are found here and prefixed. Nothing is listed by hand.
"""

from setuptools import find_packages, setup

MAPPED = {"kame.server": "server", "kame.client": "client", "kame.configs": "configs"}

packages = find_packages(include=["kame", "kame.*"])
for name, folder in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages)
