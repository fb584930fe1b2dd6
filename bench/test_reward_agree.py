"""evaluate's verdict on the same patches the reward graded: per kind, a predictions file, then
`swelake evaluate`, then resolved compared row by row."""
import json, os, subprocess, sys, collections
import pyarrow.parquet as pq
scored, lake, url, cache, cfg, work = sys.argv[1:7]
B = os.environ.get("SWELAKE", "swelake")
rows = pq.read_table(scored).to_pylist()
by = collections.defaultdict(list)
for r in rows:
    by[r["group_id"].split("/")[-1]].append(r)
total = agree = 0
for kind, rs in sorted(by.items()):
    d = f"{work}/{kind}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/preds.jsonl", "w") as f:
        for r in rs:
            f.write(json.dumps({"instance_id": r["instance_id"], "model_name_or_path": kind, "model_patch": r["predicted_patch"] or ""}) + "\n")
    subprocess.run([B, "evaluate", "--lake", lake, "--predictions", f"{d}/preds.jsonl", "--repo-url", url, "--cache-dir", cache, "--config", cfg, "--out", f"{d}/report.json", "-q"], check=True, capture_output=True)
    rep = json.load(open(f"{d}/report.json"))
    res = set(rep["resolved_ids"])
    bad = []
    for r in rs:
        ev = r["instance_id"] in res
        rw = bool(r["resolved"])
        total += 1
        agree += ev == rw
        if ev != rw:
            bad.append((r["instance_id"], rw, ev, rep["reasons"].get(r["instance_id"])))
    print(f"{kind:<11} n={len(rs):>3} reward resolved={sum(bool(r['resolved']) for r in rs):>3} evaluate resolved={len(res):>3} "
          f"errors={rep['error_instances']} empty={rep['empty_patch_instances']} disagree={bad}")
print(f"agree {agree}/{total}")
