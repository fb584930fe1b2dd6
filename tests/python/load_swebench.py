"""Loads `swelake export --format swebench` files with SWE-bench's own loader and prints, one
JSON line per instance, what a harness applies: instance_id, repo, base_commit, patch,
test_patch, and the FAIL_TO_PASS and PASS_TO_PASS lists it grades by.

Usage: load_swebench.py FILE.jsonl...
"""
import json
import sys

from swebench.harness.utils import load_swebench_dataset

FIELDS = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
    "hints_text", "created_at", "version", "environment_setup_commit", "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
for path in sys.argv[1:]:
    for inst in load_swebench_dataset(path):
        missing = [f for f in FIELDS if f not in inst]
        assert not missing, (inst.get("instance_id"), missing)
        lists = {k: json.loads(inst[k]) for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
        assert all(isinstance(v, list) and all(isinstance(t, str) for t in v) for v in lists.values()), lists
        owner, name = inst["repo"].split("/")
        assert inst["instance_id"].startswith(f"{owner}__{name}-"), inst["instance_id"]
        assert inst["patch"].startswith("diff --git "), inst["instance_id"]
        print(json.dumps({**{k: inst[k] for k in ("instance_id", "repo", "base_commit", "patch", "test_patch")}, **lists}))
