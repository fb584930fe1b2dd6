"""Loads an `swelake export --format hf` directory with `datasets.load_dataset(DIR)`, as a
user of the Hub would, and prints each split's row count as JSON.

Usage: load_hf_export.py DIR
"""
import json
import sys

import datasets

dd = datasets.load_dataset(sys.argv[1])
for split, ds in dd.items():
    for row in ds:
        assert [m["role"] for m in row["prompt"]] == ["system", "user"], row["instance_id"]
        assert row["split"] == split, row["instance_id"]
print(json.dumps({split: ds.num_rows for split, ds in dd.items()}))
