#!/usr/bin/env bash
# Compiled-kernel identity check of two builds of libmxmoe.so: the SASS of every device function, per
# architecture, and the exported symbols.
#
#   compare_kernels.sh BASE/libmxmoe.so NEW/libmxmoe.so
#
# SASS is compared per function, instruction text and encodings, with the instruction addresses
# stripped. nvcc names anonymous-namespace symbols _GLOBAL__N__<path hash>_<len>_<file>_cu_<hash>;
# the first hash comes from the source file's path, so moving a file renames its anonymous-namespace
# kernels without changing them. Those ids are replaced by one placeholder in names and bodies;
# functions are then matched as (arch, name) multisets. The script lists the names that differ only
# by that id.
# Exit status 0 when every function and the exported symbol list are identical.
set -euo pipefail
base=${1:?base libmxmoe.so}
new=${2:?new libmxmoe.so}
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo .venv/lib/python3.11/site-packages/triton/backends/nvidia/bin/cuobjdump)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$CUOBJDUMP" -sass "$base" >"$work/base.sass"
"$CUOBJDUMP" -sass "$new" >"$work/new.sass"

sass_rc=0
python3 - "$work/base.sass" "$work/new.sass" <<'PY' || sass_rc=$?
import collections, re, sys

ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]{8}")
PATH_HASH = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_")


def parse(path):
    """(arch, normalized name) -> list of (raw name, normalized body)."""
    funcs = collections.defaultdict(list)
    arch = name = None
    body = []

    def flush():
        if name is not None:
            funcs[(arch, ANON.sub("ANON", name))].append((name, "\n".join(body)))

    for line in open(path):
        m = re.match(r"\s*arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            flush()
            name, body = m.group(1), []
            continue
        if line.startswith("Fatbin"):  # next cubin: its header (path identifier) is no function's text
            flush()
            name = None
            continue
        if name is None:
            continue
        s = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # instruction address (the encodings stay)
        s = ANON.sub("ANON", s)
        s = " ".join(s.split())
        if s:
            body.append(s)
    flush()
    return funcs


base, new = parse(sys.argv[1]), parse(sys.argv[2])
ok = True
per_arch = collections.Counter()
renamed = 0
for key in sorted(set(base) | set(new), key=str):
    b, n = base.get(key, []), new.get(key, [])
    if len(b) != len(n):
        ok = False
        print(f"COUNT DIFFERS {key[0]} {key[1]}: base {len(b)}, new {len(n)}")
        continue
    if sorted(x[1] for x in b) != sorted(x[1] for x in n):
        ok = False
        print(f"SASS DIFFERS {key[0]} {key[1]}")
        continue
    per_arch[key[0]] += len(b)
    braw, nraw = sorted(x[0] for x in b), sorted(x[0] for x in n)
    if braw != nraw:
        renamed += len(b)
        only_path = [PATH_HASH.sub("_GLOBAL__N__H_", x) for x in braw] == [PATH_HASH.sub("_GLOBAL__N__H_", x) for x in nraw]
        print(f"renamed ({'path hash only' if only_path else 'anonymous-namespace id'}) {key[0]} {braw[0]} -> {nraw[0]}")
for arch, count in sorted(per_arch.items()):
    print(f"{arch}: {count} functions identical")
print(f"of which {renamed} differ in name only by nvcc's anonymous-namespace id")
sys.exit(0 if ok else 1)
PY

nm -D --defined-only "$base" | awk '{print $2, $3}' | sort >"$work/base.sym"
nm -D --defined-only "$new" | awk '{print $2, $3}' | sort >"$work/new.sym"
if diff -u "$work/base.sym" "$work/new.sym"; then
  echo "exported symbols: $(wc -l <"$work/base.sym") identical"
  sym_rc=0
else
  echo "exported symbols differ"
  sym_rc=1
fi
exit $((sass_rc | sym_rc))
