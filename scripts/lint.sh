#!/usr/bin/env bash
# Style and type checks, run by scripts/test.sh before the tests (and so by CI):
#   ruff check  (pycodestyle, pyflakes, import order, bugbear, pyupgrade: [tool.ruff] in pyproject.toml)
#   mypy        (check_untyped_defs on kame/, server/, client/: [tool.mypy])
#   mkdocs      (the docs site, mkdocs.yml over docs/, built with --strict: a broken link or a page left
#                out of the nav fails; tests/test_front_door.py checks README.md's links)
# server/ and client/ ship as kame.server and kame.client (package-dir in pyproject.toml), which mypy
# cannot read from setuptools: it checks them through a view of symlinks, .mypy_view/kame/, and the
# paths it prints are mapped back to the repository's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${KAME_LINT_PYTHON:-.venv/bin/python}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute (mypy runs in the view), links kept
rc=0
"$PY" -m ruff check --quiet --output-format concise . || rc=1

view=.mypy_view
rm -rf "$view" && mkdir -p "$view/kame"
for entry in kame/*; do ln -s "../../$entry" "$view/kame/$(basename "$entry")"; done
ln -s ../../server "$view/kame/server"
ln -s ../../client "$view/kame/client"
ln -s ../../configs "$view/kame/configs"
out=$(cd "$view" && "$PY" -m mypy --config-file ../pyproject.toml --cache-dir ../.mypy_cache -p kame 2>&1)
mypy_rc=$?
echo "$out" | sed -e 's#^kame/server/#server/#' -e 's#^kame/client/#client/#' -e 's#^kame/configs/#configs/#' | grep -v '^Success' || true
[ $mypy_rc -eq 0 ] || rc=1
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --quiet --site-dir "$site" || rc=1
rm -rf "$site"
[ $rc -eq 0 ] && echo "lint.sh: ruff, mypy and mkdocs clean" || echo "lint.sh: ruff, mypy or mkdocs failed" >&2
exit $rc
