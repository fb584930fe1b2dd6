"""psycopg 3 (the extended protocol, as JDBC, asyncpg and SQLAlchemy speak it) against
`swelake serve --pg-bind`: writes in every disguise, settings across two connections, and the
limits on queries, cursors and EXPLAIN ANALYZE. Prints one JSON object of what it saw; the Rust
test (tests/it/console.rs) judges it.

usage: console_pg.py HOST PORT SCRATCH_DIR
"""

import json
import sys
import time

import psycopg

HOST, PORT, SCRATCH = sys.argv[1], int(sys.argv[2]), sys.argv[3]
HEAVY = "SELECT count(*) FROM range(1, 30000000000) WHERE value % 7 = 3"


def connect():
    c = psycopg.connect(host=HOST, port=PORT, user="analyst", dbname="lake", autocommit=True, connect_timeout=10)
    c.seen_notices = []
    c.add_notice_handler(lambda d: c.seen_notices.append(d.message_primary))
    return c


def attempt(c, sql, params=None, prepare=None):
    """Runs one statement; what happened, as data."""
    c.seen_notices.clear()
    started = time.monotonic()
    try:
        with c.cursor() as cur:
            cur.execute(sql, params, prepare=prepare)
            rows = cur.fetchall() if cur.description else None
        r = {"ok": True, "rows": None if rows is None else [[str(v) for v in row] for row in rows]}
    except psycopg.Error as e:
        r = {"ok": False, "sqlstate": e.sqlstate, "error": str(e).strip()}
    r["seconds"] = round(time.monotonic() - started, 3)
    r["notices"] = list(c.seen_notices)
    return r


def main():
    out = {}
    a, b = connect(), connect()

    writes = {
        "explain_analyze_copy": f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{SCRATCH}/psycopg-explain-copy.csv'",
        "copy": f"COPY (SELECT 'x') TO '{SCRATCH}/psycopg-copy.csv'",
        "explain_analyze_insert": "EXPLAIN ANALYZE INSERT INTO pull_requests (repo_name, number) VALUES ('x/y', 1)",
        "explain_analyze_delete": "EXPLAIN ANALYZE DELETE FROM pull_requests WHERE number > 0",
        "explain_analyze_update": "EXPLAIN ANALYZE UPDATE pull_requests SET title = 'x'",
        "create_table_as": "CREATE TABLE copied AS SELECT * FROM pull_requests",
        "create_external_table": f"CREATE EXTERNAL TABLE ext (a INT) STORED AS CSV LOCATION '{SCRATCH}/psycopg-ext.csv'",
        "insert": "INSERT INTO pull_requests (repo_name, number) VALUES ('x/y', 1)",
    }
    out["writes"] = {k: attempt(a, sql) for k, sql in writes.items()}
    # A prepared INSERT with bound parameters: refused at Parse, so never bound or run.
    out["writes"]["prepared_insert"] = attempt(
        a, "INSERT INTO pull_requests (repo_name, number) VALUES (%s, %s)", ("x/y", 1), prepare=True
    )
    # The connection still answers after every refusal.
    out["after_refusals"] = attempt(a, "SELECT count(*) FROM pull_requests")

    # Settings are the connection's own, and the engine's are nobody's.
    out["set_engine"] = attempt(a, "SET datafusion.execution.batch_size = 3")
    out["set_memory"] = attempt(a, "SET datafusion.runtime.memory_limit = '1K'")
    out["set_spill"] = attempt(a, "SET datafusion.runtime.temp_directory = '/tmp'")
    out["set_application_name"] = attempt(a, "SET application_name = 'connection-a'")
    out["a_application_name"] = attempt(a, "SHOW application_name")
    out["b_application_name"] = attempt(b, "SHOW application_name")
    out["b_batch_size"] = attempt(b, "SHOW datafusion.execution.batch_size")
    out["a_batch_size"] = attempt(a, "SHOW datafusion.execution.batch_size")
    # A prepared query with a parameter, in binary results (what JDBC asks for on reuse).
    with a.cursor(binary=True) as cur:
        cur.execute("SELECT number, repo_name FROM pull_requests WHERE number >= %s ORDER BY number LIMIT 3", (0,))
        out["binary_rows"] = [[str(v) for v in row] for row in cur.fetchall()]

    # Limits (the server runs with --row-limit 5 --timeout 3s).
    out["events"] = attempt(a, "SELECT * FROM events")
    out["heavy_extended"] = attempt(a, HEAVY)
    out["explain_analyze_heavy"] = attempt(a, "EXPLAIN ANALYZE " + HEAVY)
    out["declare"] = attempt(b, "DECLARE c CURSOR FOR SELECT * FROM events")
    out["fetch_all"] = attempt(b, "FETCH ALL FROM c")
    out["close"] = attempt(b, "CLOSE c")
    out["declare_heavy"] = attempt(b, "DECLARE h CURSOR FOR " + HEAVY)
    # psycopg's own server-side cursor (DECLARE, then Describe of the portal, then FETCH).
    try:
        with b.transaction(), b.cursor(name="named") as cur:
            cur.execute("SELECT id, type FROM events ORDER BY id")
            names = [d.name for d in cur.description]
            out["named_cursor"] = {"ok": True, "columns": names, "rows": len(cur.fetchall())}
    except psycopg.Error as e:
        out["named_cursor"] = {"ok": False, "sqlstate": e.sqlstate, "error": str(e).strip()}
    # A client lowers its own time limit, and cannot raise it.
    out["set_timeout_low"] = attempt(b, "SET statement_timeout = '1s'")
    out["show_timeout_low"] = attempt(b, "SHOW statement_timeout")
    out["heavy_low"] = attempt(b, HEAVY)
    out["set_timeout_high"] = attempt(b, "SET statement_timeout = '10min'")
    out["show_timeout_high"] = attempt(b, "SHOW statement_timeout")
    out["show_timeout_other"] = attempt(a, "SHOW statement_timeout")
    print(json.dumps(out))


main()
