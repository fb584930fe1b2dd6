"""Row-sorted digests of a lake's Delta tables, to show that two lakes hold the same rows
(`swelake bench` results before and after a change, a rerun, a run on more threads).

Usage: python3 bench/table_digest.py LAKE [TABLE ...]   (default: events and the PR tables)

For each table: the active files of its latest version (from `_delta_log`: commits after
the last checkpoint replayed over it), each row rendered as text by DuckDB and hashed
(md5), the hashes sorted and hashed again. Row order and file layout do not count; every
column's value does, except those that only record when the run happened (VOLATILE).
Prints `table rows digest` per line.
"""

import glob
import json
import os
import sys

import duckdb

DEFAULT = ["events", "events_rejected", "pr_timeline", "pull_requests", "issues", "pr_issue_links"]
# Columns that record when a run happened, not what it computed.
VOLATILE = {"events_rejected": ["ingested_at"]}


def active_files(table_dir):
    log = os.path.join(table_dir, "_delta_log")
    files = {}
    start = -1
    last = os.path.join(log, "_last_checkpoint")
    if os.path.exists(last):
        cp = json.load(open(last))
        start = cp["version"]
        parts = sorted(glob.glob(os.path.join(log, f"{start:020d}.checkpoint*.parquet")))
        con = duckdb.connect()
        for p in parts:
            for (path,) in con.execute(
                f"SELECT add.path FROM read_parquet('{p}') WHERE add IS NOT NULL"
            ).fetchall():
                files[path] = True
    for f in sorted(glob.glob(os.path.join(log, "*.json"))):
        version = int(os.path.basename(f).split(".")[0])
        if version <= start:
            continue
        for line in open(f):
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = True
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
    return [os.path.join(table_dir, p) for p in sorted(files)]


def digest(table_dir, exclude):
    files = active_files(table_dir)
    if not files:
        return 0, "empty"
    con = duckdb.connect()
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    drop = f"EXCLUDE ({', '.join(exclude)})" if exclude else ""
    rows, d = con.execute(
        f"""SELECT count(*), md5(string_agg(h, ',' ORDER BY h))
            FROM (SELECT md5(CAST(t AS VARCHAR)) AS h
                  FROM (SELECT * {drop} FROM read_parquet([{listed}], hive_partitioning = true,
                                                          union_by_name = true)) t)"""
    ).fetchone()
    return rows, d


def main():
    lake = sys.argv[1]
    tables = sys.argv[2:] or DEFAULT
    for t in tables:
        path = os.path.join(lake, t)
        if not os.path.isdir(path):
            print(f"{t} missing -")
            continue
        rows, d = digest(path, VOLATILE.get(t, []))
        print(f"{t} {rows} {d}")


if __name__ == "__main__":
    main()
