"""Baseline of `swelake bench ingest`: DuckDB's typed read_json of one hour file into Parquet.
Prints the seconds. Usage: duckdb_ingest.py HOUR.json.gz OUT.parquet [THREADS (default 1)]"""
import sys, time, duckdb
src, out = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
con = duckdb.connect()
con.execute(f"SET threads={threads}")
t = time.perf_counter()
con.execute(f"""COPY (SELECT * FROM read_json('{src}', format='newline_delimited', columns={{id:'VARCHAR', type:'VARCHAR', actor:'STRUCT(id BIGINT, login VARCHAR)', repo:'STRUCT(id BIGINT, name VARCHAR)', payload:'JSON', public:'BOOLEAN', created_at:'TIMESTAMP', org:'STRUCT(id BIGINT, login VARCHAR)'}})) TO '{out}' (FORMAT parquet)""")
print(time.perf_counter() - t)
