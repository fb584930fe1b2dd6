//! The limits every query of `swelake serve` runs under, whichever protocol brought it: a time
//! limit (waiting for a slot included), a row limit, a memory pool of its own, and a cap on the
//! queries that run at once. Plans reach [`Limits::run`] only through [`guard::check`], which
//! it calls again itself: no path executes a plan the guard has not seen.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::sql::guard::{self, QueryError};

/// A query's first rows, and whether more were left out.
pub struct Limited {
    pub batches: Vec<RecordBatch>,
    pub schema: SchemaRef,
    pub truncated: bool,
}

/// The server's limits, shared by every connection and request.
#[derive(Debug)]
pub struct Limits {
    /// Rows a query returns at most.
    pub rows: usize,
    /// How long a query may take, from its arrival.
    pub time: Duration,
    /// Bytes the operators of one query may reserve (sorts, joins, aggregates; they spill to
    /// disk where they can).
    pub memory: usize,
    slots: Arc<Semaphore>,
}

impl Limits {
    pub fn new(rows: usize, time: Duration, memory: usize, max_queries: usize) -> Limits {
        Limits { rows: rows.max(1), time, memory, slots: Arc::new(Semaphore::new(max_queries.max(1))) }
    }

    /// Runs `plan` under these limits, keeping at most `rows` rows (the caller's cut: clients
    /// get at most [`Limits::rows`]), within `time` or the server's limit if that is lower.
    /// Refuses a plan that writes.
    pub async fn run(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
        time: Duration,
        rows: usize,
    ) -> Result<Limited, QueryError> {
        guard::check(&plan)?;
        let client = time < self.time;
        let time = time.min(self.time);
        let deadline = Instant::now() + time;
        let _slot = match tokio::time::timeout_at(deadline, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed.
            Ok(Err(_)) | Err(_) => return Err(QueryError::Timeout { limit: time, waiting: true, client }),
        };
        let top = NonZeroUsize::new(3).expect("3 is not zero");
        let pool: Arc<dyn MemoryPool> = Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(self.memory), top));
        let state = state_with_pool(state, pool.clone())?;
        let held_pool = pool.clone();
        let run = async move {
            let pool = held_pool;
            let df = DataFrame::new(state, plan);
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            let mut stream = df.execute_stream().await?;
            // The rows kept for the client count against the same pool: 10,000 rows of file
            // contents are memory too.
            let held = MemoryConsumer::new("the result kept for the client").register(&pool);
            let (mut batches, mut kept, mut truncated) = (Vec::new(), 0usize, false);
            while let Some(b) = stream.next().await {
                let mut b = b?;
                if kept + b.num_rows() > rows {
                    b = b.slice(0, rows - kept);
                    truncated = true;
                }
                held.try_grow(b.get_array_memory_size())?;
                kept += b.num_rows();
                batches.push(b);
                if truncated {
                    break;
                }
            }
            Ok::<_, datafusion::error::DataFusionError>(Limited { batches, schema, truncated })
        };
        // The query runs on a task of its own: work that does not yield (a scalar folded
        // while the plan is optimized) cannot hold the answer past the deadline, and aborting
        // the task drops the stream, which cancels the query's other tasks.
        let mut task = tokio::spawn(run);
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(r)) => r.map_err(|e| QueryError::from_datafusion(&e)),
            Ok(Err(e)) => Err(QueryError::Failed(format!("the query stopped: {e}"))),
            Err(_) => {
                task.abort();
                Err(QueryError::Timeout { limit: time, waiting: false, client })
            }
        }
    }
}

/// The session with a memory pool of one query's own: the caches, the object stores and the
/// spill directory stay the server's.
fn state_with_pool(state: &SessionState, pool: Arc<dyn MemoryPool>) -> Result<SessionState, QueryError> {
    let runtime = RuntimeEnvBuilder::from_runtime_env(state.runtime_env())
        .with_memory_pool(pool)
        .build_arc()
        .map_err(|e| QueryError::from_datafusion(&e))?;
    Ok(SessionStateBuilder::new_from_existing(state.clone()).with_runtime_env(runtime).build())
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn planned(ctx: &SessionContext, sql: &str) -> LogicalPlan {
        guard::plan(&ctx.state(), sql).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rows_time_and_memory_are_bounded() {
        let ctx = SessionContext::new();
        let limits = Limits::new(5, Duration::from_secs(2), 8 << 20, 2);
        let r = limits
            .run(&ctx.state(), planned(&ctx, "SELECT * FROM range(1, 100)").await, limits.time, limits.rows)
            .await
            .unwrap();
        assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
        assert!(r.truncated);

        let heavy = planned(&ctx, "SELECT count(*) FROM range(1, 30000000000) WHERE value % 7 = 3").await;
        let started = std::time::Instant::now();
        let e = limits.run(&ctx.state(), heavy, limits.time, limits.rows).await.err().unwrap();
        assert_eq!(e.sqlstate(), "57014", "{e}");
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());

        // A client's own, lower limit holds too.
        let e = limits
            .run(
                &ctx.state(),
                planned(&ctx, "EXPLAIN ANALYZE SELECT count(*) FROM range(1, 30000000000)").await,
                Duration::from_millis(300),
                5,
            )
            .await
            .err()
            .unwrap();
        assert!(matches!(e, QueryError::Timeout { limit, .. } if limit == Duration::from_millis(300)), "{e}");

        // An accumulator that cannot spill, over 8 MiB of values.
        let big = planned(&ctx, "SELECT array_agg(value) FROM range(1, 10000000)").await;
        let e = limits.run(&ctx.state(), big, limits.time, limits.rows).await.err().unwrap();
        assert_eq!(e.sqlstate(), "53200", "{e}");
        assert!(e.to_string().contains("--memory-limit"), "{e}");
        // The rows kept for the client count too: 5 rows of 4 MiB strings are past 8 MiB.
        let wide = planned(&ctx, "SELECT repeat('x', 4194304) AS s FROM range(1, 6)").await;
        let e = limits.run(&ctx.state(), wide, limits.time, limits.rows).await.err().unwrap();
        assert_eq!(e.sqlstate(), "53200", "{e}");
        // The pool was the query's own: the next query runs.
        let r = limits.run(&ctx.state(), planned(&ctx, "SELECT 1").await, limits.time, limits.rows).await.unwrap();
        assert_eq!(r.batches[0].num_rows(), 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_query_waits_for_a_slot_within_its_time_limit() {
        let ctx = SessionContext::new();
        let limits = Arc::new(Limits::new(5, Duration::from_secs(1), 64 << 20, 1));
        let heavy = planned(&ctx, "SELECT count(*) FROM range(1, 30000000000)").await;
        let (l, state) = (limits.clone(), ctx.state());
        let first = tokio::spawn(async move { l.run(&state, heavy, l.time, l.rows).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let quick = planned(&ctx, "SELECT 1").await;
        let e = limits.run(&ctx.state(), quick, Duration::from_millis(300), 5).await.err().unwrap();
        assert!(matches!(e, QueryError::Timeout { waiting: true, .. }), "{e}");
        assert!(e.to_string().contains("--max-queries"), "{e}");
        assert_eq!(first.await.unwrap().err().unwrap().sqlstate(), "57014");
        // The slot is free again.
        limits.run(&ctx.state(), planned(&ctx, "SELECT 1").await, limits.time, 5).await.unwrap();
    }
}
