"""DuckDB baseline of `swelake bench jobs`: pr_timeline and pull_requests over the same events
Parquet files, with swelake's own sql/ files ported to DuckDB's dialect by `port` below (so the
baseline runs the query swelake runs, and cannot drift from it).

Usage: python3 bench/duckdb_pr_jobs.py FILE_LIST THREADS [REPEAT]
FILE_LIST holds the events table's active Parquet files, one path per line (the Delta version
swelake read; the partition column comes from the `event_date=` directories). Prints one JSON
line: rows and merged count of each table, the seconds of each of REPEAT runs of each query
(`*_runs`) and their median (`*_seconds`).

Each query runs two ways: into a DuckDB table in memory (`*_runs`), and as swelake's jobs run,
Parquet in and Parquet out (`*_parquet_runs`): `COPY ... TO` a zstd Parquet file, with
pull_requests reading pr_timeline's file, as swelake's pull_requests reads its table.
"""

import json
import os
import re
import statistics
import shutil
import sys
import tempfile
import time

import duckdb

HERE = os.path.dirname(os.path.abspath(__file__))
SQL = os.path.join(HERE, "..", "sql")


def port(sql):
    """swelake's SQL in DuckDB's dialect, for a first run over the whole lake: DataFusion's
    `first_value(x ORDER BY ...)` aggregate is DuckDB's `first(x ORDER BY ...)`, swelake's
    `latest_by(x, at, tiebreak)` is `first(x ORDER BY at DESC, tiebreak DESC)` (DuckDB's
    fastest form of it here: 0.64 s for pull_requests against 0.85 s with `arg_max(x, (at,
    tiebreak))`), and the job's `{input}_new` views (the partitions a run processes) are the
    whole inputs."""
    sql = re.sub(r"\bfirst_value\(", "first(", sql)
    sql = re.sub(r"\blatest_by\(([^,()]+), ([^,()]+), ([^,()]+)\)", r"first(\1 ORDER BY \2 DESC, \3 DESC)", sql)
    return re.sub(r"\b(events|pr_timeline)_new\b", r"\1", sql)


def main():
    files = [line.strip() for line in open(sys.argv[1]) if line.strip()]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    repeat = max(1, int(sys.argv[3])) if len(sys.argv) > 3 else 1
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    con.execute("SET preserve_insertion_order = false")
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet([{listed}], hive_partitioning = true)")
    # The tables a first run of swelake's job sees empty: git's facts and the last run.
    con.execute(
        """CREATE TABLE pr_git_facts (repo_name VARCHAR, number BIGINT, kind VARCHAR,
        merged BOOLEAN, merged_at TIMESTAMPTZ, base_sha VARCHAR, head_sha VARCHAR,
        merge_commit_sha VARCHAR, base_ref VARCHAR, head_ref VARCHAR, title VARCHAR,
        body VARCHAR, author_login VARCHAR, found_at TIMESTAMPTZ)"""
    )
    con.execute("CREATE TABLE job_last_run AS SELECT TIMESTAMPTZ '1970-01-01 00:00:00+00' AS last_run_at")
    out = {}
    names = ["pr_timeline", "pull_requests"]
    for name in names:
        out[f"{name}_runs"] = []
    for _ in range(repeat):
        for name in names:
            con.execute(f"DROP TABLE IF EXISTS {name}")
        for name in names:
            sql = port(open(os.path.join(SQL, f"{name}.sql")).read())
            t = time.perf_counter()
            con.execute(f"CREATE TABLE {name} AS {sql}")
            out[f"{name}_runs"].append(time.perf_counter() - t)
    for name in names:
        out[f"{name}_seconds"] = statistics.median(out[f"{name}_runs"])
        out[f"{name}_rows"] = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
    out["pull_requests_merged"] = con.execute("SELECT count(*) FROM pull_requests WHERE merged").fetchone()[0]

    # Parquet in, Parquet out.
    work = tempfile.mkdtemp(prefix="swelake-duckdb-")
    try:
        for name in names:
            out[f"{name}_parquet_runs"] = []
            con.execute(f"DROP TABLE IF EXISTS {name}")
        for _ in range(repeat):
            for name in names:
                path = os.path.join(work, f"{name}.parquet")
                sql = port(open(os.path.join(SQL, f"{name}.sql")).read())
                con.execute(f"DROP VIEW IF EXISTS {name}")
                t = time.perf_counter()
                con.execute(f"COPY ({sql}) TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
                out[f"{name}_parquet_runs"].append(time.perf_counter() - t)
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
        for name in names:
            out[f"{name}_parquet_rows"] = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["duckdb_version"] = duckdb.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
