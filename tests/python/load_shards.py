"""Loads seed shards the way verl's RLHFDataset and TRL do (Hugging Face `datasets`, Parquet
builder) and checks the columns trainers read. Prints {"rows", "columns"} as JSON.

Usage: load_shards.py GLOB
"""
import glob
import json
import sys

import datasets

files = sorted(glob.glob(sys.argv[1]))
assert files, f"no shard matches {sys.argv[1]}"
ds = datasets.load_dataset("parquet", data_files=files, split="train")
for row in ds:
    prompt = row["prompt"]
    assert isinstance(prompt, list) and prompt, row["instance_id"]
    assert [m["role"] for m in prompt] == ["system", "user"], row["instance_id"]
    assert all(isinstance(m["content"], str) and m["content"] for m in prompt), row["instance_id"]
    for col in ("context", "oracle", "prompt_context"):
        assert all(set(f) == {"path", "content"} for f in row[col]), (row["instance_id"], col)
    truth = json.loads(row["reward_model"]["ground_truth"])
    assert truth["oracle"] == {f["path"]: f["content"] for f in row["oracle"]}, row["instance_id"]
    assert row["extra_info"]["pr_number"] > 0
print(json.dumps({"rows": ds.num_rows, "columns": ds.column_names}))
