#!/usr/bin/env bash
# The GPU check for a lent CUDA machine that has python, torch and numpy and reaches no registry.
#
#   bash bench/gpu_check.sh --prepare DIR [--python-version 3.12]   (here, with PyPI: writes DIR)
#   bash DIR/run.sh [--smoke] [gpu_check.py all options]            (there: writes DIR/gpu_check.json)
#
# --prepare writes a self-contained folder (at most 64 MiB): kame's source laid out as the installed
# package (server/, client/, configs/ as kame.server, kame.client, kame.configs), bench/gpu_check.py,
# cp312 manylinux x86_64 wheels of every module the check imports but torch and numpy (moshi without its
# torch pin: --no-deps, each dependency named), and run.sh. The wheels are cached in
# $KAME_GPU_WHEELS (default ~/.cache/kame-gpu-check-wheels), so a second --prepare downloads nothing.
# WebRTC (aiortc, av), Whisper (faster-whisper, ctranslate2), Opus (sphn), MCP and the rest stay out: the server run
# uses the Realtime protocol with PCM16 and no ASR, and kame imports those lazily.
#
# Without --prepare (from a checkout with .venv): the run itself, as DIR/run.sh does it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# What the check imports, beyond torch and numpy (pins from requirements/constraints.txt).
PACKAGES=(
    moshi einops sentencepiece safetensors huggingface_hub filelock fsspec packaging pyyaml tqdm requests urllib3
    charset-normalizer
    typing_extensions pydantic pydantic_core annotated-types typing-inspection
    fastapi opentelemetry-api starlette anyio idna sniffio annotated-doc uvicorn h11 click websockets
    prometheus_client openai httpx2 httpcore2 truststore httpx httpcore certifi distro jiter python-multipart
    webrtcvad-wheels  # the turn detector (kame.asr.vad), which the server's host module imports at its top
    bitsandbytes  # frontend.weights int8 (moshi's 8-bit layers): the int8 stage, 41 MiB of the folder
)

if [ "${1:-}" != "--prepare" ]; then
    PY=${PYTHON:-python3}
    [ -x "$ROOT/.venv/bin/python" ] && PY=$ROOT/.venv/bin/python
    exec "$PY" "$ROOT/bench/gpu_check.py" all "$@"
fi

DIR=${2:?usage: gpu_check.sh --prepare DIR [--python-version X.Y]}
PYVER=3.12
[ "${3:-}" = "--python-version" ] && PYVER=${4:?}
PIP=${PIP:-python3 -m pip}
[ -x "$ROOT/.venv/bin/python" ] && PIP="$ROOT/.venv/bin/python -m pip"
CACHE=${KAME_GPU_WHEELS:-$HOME/.cache/kame-gpu-check-wheels}/cp${PYVER/./}
mkdir -p "$CACHE" "$DIR"
DIR=$(cd "$DIR" && pwd)
rm -rf "$DIR/src" "$DIR/wheels" "$DIR/site"
mkdir -p "$DIR/src" "$DIR/wheels" "$DIR/bench"

# The source, laid out as setup.py installs it.
copy() { (cd "$ROOT/$1" && find . -name __pycache__ -prune -o -type f ! -name '*.pyc' -print0 | \
    xargs -0 -I{} install -D -m 644 {} "$DIR/src/$2/{}"); }
copy kame kame
copy server kame/server
copy client kame/client
copy configs kame/configs
rm -rf "$DIR/src/kame/server/static" "$DIR/src/kame/data/mt_bench"  # web pages, evaluation data: not needed
cp "$ROOT/bench/gpu_check.py" "$ROOT/bench/gpu_check_schedule.py" "$DIR/bench/"
echo "$PYVER" > "$DIR/python_version"

# The wheels: for the box's Python and platform, binary only, no dependency resolution (each one named).
pins=()
for p in "${PACKAGES[@]}"; do
    norm=$(echo "$p" | tr '_' '-' | tr 'A-Z' 'a-z')
    pin=$(grep -i -E "^${norm//-/[-_]}==" "$ROOT/requirements/constraints.txt" | head -1 | cut -d';' -f1 || true)
    if [ "$norm" = moshi ]; then pin=moshi==0.2.13; fi
    pins+=("${pin:-$norm}")
done
$PIP download -q 2> >(grep -v "^WARNING: Location" >&2) --disable-pip-version-check --no-deps --only-binary=:all: --implementation cp \
    --python-version "$PYVER" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$CACHE" "${pins[@]}"
python3 - "$CACHE" "$DIR/wheels" "${pins[@]}" <<'PYEOF'
import shutil, sys
from pathlib import Path
cache, dest, pins = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
def norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")
for pin in pins:
    name, _, ver = pin.partition("==")
    found = sorted(w for w in cache.glob("*.whl")
                   if norm(w.name.split("-")[0]) == norm(name) and (not ver or w.name.split("-")[1] == ver))
    if not found:
        sys.exit(f"gpu_check.sh: no wheel for {pin} in {cache}")
    shutil.copy(found[-1], dest)
PYEOF
cat > "$DIR/run.sh" <<'EOF'
#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py all): needs python with torch and numpy; writes gpu_check.json here
# (on a box without them, or with another Python than the wheels', a gpu_check.json that says what is missing).
# --smoke: the same code on CPU at tiny size. Other options go to gpu_check.py all.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
SITE=$HERE/site
[ -w "$HERE" ] || SITE=${TMPDIR:-/tmp}/kame-gpu-check-site
if [ ! -f "$SITE/.complete" ]; then
    rm -rf "$SITE" && mkdir -p "$SITE"
    "$PY" - "$SITE" "$HERE"/wheels/*.whl <<'PYEOF' || exit 1
import shutil, sys, zipfile
from pathlib import Path
site = Path(sys.argv[1])
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(site)
for data in site.glob("*.data"):  # a wheel's purelib/platlib parts belong in site-packages
    for part in ("purelib", "platlib"):
        if (data / part).is_dir():
            shutil.copytree(data / part, site, dirs_exist_ok=True)
    shutil.rmtree(data)
(site / ".complete").write_text("")
PYEOF
fi
export PYTHONPATH=$HERE/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1 KAME_CACHE_DIR=${KAME_CACHE_DIR:-${TMPDIR:-/tmp}/kame-gpu-check-cache}
export GPU_CHECK_PYTHON=$(cat "$HERE/python_version" 2>/dev/null)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import sys, torch, numpy; print("python", sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__, "cuda", torch.cuda.is_available())' 2>/dev/null
cd "$HERE" && exec "$PY" "$HERE/bench/gpu_check.py" all --out "$HERE/gpu_check.json" "$@"
EOF
chmod +x "$DIR/run.sh"
echo "gpu_check.sh: prepared $DIR ($(du -sh "$DIR" | cut -f1), $(ls "$DIR/wheels" | wc -l) wheels for Python $PYVER)"
