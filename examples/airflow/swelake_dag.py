"""An Airflow DAG for a swelake lake on object storage.

Every hour: ingest the hours of the run's data interval, bring the SQL jobs up to date, then
the git stages and the seed dataset; once a day, compact and checkpoint the tables. Each task
is one `swelake` command; exit status 75 (another run holds the same inputs) is retried by
Airflow like any failure, after `retry_delay`.

Set the Airflow Variable `swelake_lake` (s3://bucket/prefix) and give the workers the
AWS_* variables (or use --storage-option).
"""

from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator

LAKE = "{{ var.value.get('swelake_lake', 's3://my-bucket/swelake') }}"
HOURS = (
    "--from {{ data_interval_start.strftime('%Y-%m-%d') }}-{{ data_interval_start.hour }} "
    "--to {{ data_interval_start.strftime('%Y-%m-%d') }}-{{ data_interval_start.hour }}"
)
DAY = "{{ data_interval_start.strftime('%Y-%m-%d') }}"

default_args = {
    "owner": "data-eng",
    "retries": 3,
    "retry_delay": timedelta(minutes=5),
    "retry_exponential_backoff": True,
}

with DAG(
    dag_id="swelake_hourly",
    description="GH Archive -> PR tables -> snapshots -> SWE-RL seed dataset",
    schedule="15 * * * *",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=2,
    default_args=default_args,
    tags=["swelake"],
) as dag:
    ingest = BashOperator(
        task_id="ingest",
        bash_command=f"swelake ingest --json --source https://data.gharchive.org/ --lake {LAKE} {HOURS}",
    )
    sql_jobs = BashOperator(
        task_id="sql_jobs",
        bash_command=(
            f"swelake run pull_requests pr_issue_links issues --json --lake {LAKE} --since {DAY} --until {DAY}"
        ),
    )
    git_and_seed = BashOperator(
        task_id="git_and_seed",
        bash_command=(
            f"swelake run --all --json --lake {LAKE} --since {DAY} --until {DAY} "
            "--repo-url 'https://github.com/{repo}.git' --cache-dir /var/cache/swelake/mirrors"
        ),
        execution_timeout=timedelta(hours=2),
    )
    ingest >> sql_jobs >> git_and_seed

with DAG(
    dag_id="swelake_maintenance",
    description="Compact small files, checkpoint and vacuum the swelake lake",
    schedule="@daily",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    default_args=default_args,
    tags=["swelake"],
) as maintenance:
    BashOperator(task_id="maintain", bash_command=f"swelake maintain --json --lake {LAKE} --vacuum-retention 7d")
