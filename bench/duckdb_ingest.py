"""Baseline of `swelake bench ingest`: DuckDB's typed read_json of one hour file into Parquet, one
thread. Prints the seconds. Usage: duckdb_ingest.py HOUR.json.gz OUT.parquet"""
import sys, time, duckdb
src, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET threads=1")
t = time.perf_counter()
con.execute(f"""COPY (SELECT * FROM read_json('{src}', format='newline_delimited', columns={{id:'VARCHAR', type:'VARCHAR', actor:'STRUCT(id BIGINT, login VARCHAR)', repo:'STRUCT(id BIGINT, name VARCHAR)', payload:'JSON', public:'BOOLEAN', created_at:'TIMESTAMP', org:'STRUCT(id BIGINT, login VARCHAR)'}})) TO '{out}' (FORMAT parquet)""")
print(time.perf_counter() - t)
