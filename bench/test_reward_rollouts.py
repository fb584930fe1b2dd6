"""Rollouts of five kinds per verified instance of a lake's seed shards (issue 57's Show):
gold (SWE-RL whole-file edits of every oracle file, and the PR's non-test diff as a diff answer),
empty, tests only, half gold (first hunk of a multi-hunk code diff), garbage."""
import json, re, sys
import pyarrow as pa, pyarrow.parquet as pq

lake, out = sys.argv[1], sys.argv[2]
rows = pq.read_table(f"{lake}/shards/seed/part-00000.parquet").to_pylist()

def is_test(p):
    parts = p.split("/")
    name = parts[-1]
    return any(x in ("tests", "test", "testing", "testsuite") for x in parts[:-1]) or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"

def sections(patch):
    out, cur = [], None
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            cur = [line]
            out.append(cur)
        elif cur is not None:
            cur.append(line)
    res = []
    for s in out:
        m = re.match(r"diff --git a/(\S+) b/(\S+)", s[0])
        res.append((m.group(2), "".join(s)))
    return res

def hunks(section):
    head, hs = [], []
    for line in section.splitlines(keepends=True):
        if line.startswith("@@"):
            hs.append([line])
        elif hs:
            hs[-1].append(line)
        else:
            head.append(line)
    return "".join(head), ["".join(h) for h in hs]

def think(body):
    return f"<think>\nThe fix.\n</think>\n<solution>\n{body}\n</solution>"

recs = []
kinds = {}
for r in rows:
    if not r["verified"]:
        continue
    iid = r["instance_id"]
    ctx = {c["path"]: c["content"] for c in r["context"]}
    ora = {c["path"]: c["content"] for c in r["oracle"]}
    secs = sections(r["oracle_patch"])
    code = [s for p, s in secs if not is_test(p)]
    tests = [s for p, s in secs if is_test(p)]
    edits = []
    for p, new in ora.items():
        old = ctx.get(p, "")
        if old == new:
            continue
        search = old[:-1] if old.endswith("\n") else old
        replace = new[:-1] if new.endswith("\n") else new
        edits.append(f"```python\n### {p}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```")
    comps = {
        "gold_edits": think("\n".join(edits)),
        "gold_diff": "".join(code),
        "empty": "",
        "garbage": "diff --git a/nowhere.py b/nowhere.py\n--- a/nowhere.py\n+++ b/nowhere.py\n@@ -10,3 +10,3 @@\n def f():\n-    return 1\n+    return 2\n",
    }
    if tests:
        comps["tests_only"] = "".join(tests)
    # half: the first hunk of the code diff, where it has two or more
    allh = []
    for s in code:
        h, hs = hunks(s)
        allh.append((h, hs))
    if sum(len(hs) for _, hs in allh) >= 2:
        h, hs = allh[0]
        comps["half_gold"] = h + hs[0]
    for k, (kind, c) in enumerate(sorted(comps.items())):
        recs.append({"instance_id": iid, "group_id": f"{iid}/{kind}", "sample_index": k, "completion": c, "kind": kind})
        kinds[kind] = kinds.get(kind, 0) + 1
pq.write_table(pa.Table.from_pylist(recs), out)
print(json.dumps({"rows": len(recs), "kinds": kinds}))
