//! `swelake sql`: a read-only query over every table of a lake.

use std::io::BufWriter;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, ValueEnum};

use super::args::LakeArg;
use super::Ctx;

#[derive(Args, Debug)]
pub(crate) struct SqlArgs {
    #[command(flatten)]
    lake: LakeArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Table)]
    format: FormatArg,
    /// Run the query on a Ballista cluster (`swelake ballista …`) instead of here.
    #[arg(long, value_name = "df://HOST:PORT")]
    scheduler: Option<String>,
    /// The query (SELECT/WITH/SHOW/DESCRIBE/EXPLAIN). Without one, an interactive shell
    /// (statements end with `;`; `\d` lists the tables, `\d TABLE` a table's columns), or,
    /// with piped input, its statements in turn.
    query: Option<String>,
}

impl SqlArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let lake = a.lake.open(ctx)?;
        let Some(query) = a.query else {
            if a.scheduler.is_some() {
                anyhow::bail!("the shell runs here: give --scheduler with a query");
            }
            let ok = crate::console::shell::run(&lake, a.format.into()).await?;
            return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
        };
        let batches = match &a.scheduler {
            None => crate::sql::query(&lake, &query).await?,
            Some(s) => crate::sql::query_on_cluster(&lake, &crate::distributed::scheduler_url(s)?, &query).await?,
        };
        let stdout = std::io::stdout();
        crate::sql::write(&batches, a.format.into(), BufWriter::new(stdout.lock()))?;
        Ok(ExitCode::SUCCESS)
    }
}

/// How `swelake sql` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    /// Aligned text table.
    Table,
    /// CSV with a header row.
    Csv,
    /// One JSON array of row objects (every column a key, null when NULL).
    Json,
    /// One JSON object per line (every column a key, null when NULL).
    Jsonl,
}

impl From<FormatArg> for crate::sql::Format {
    fn from(f: FormatArg) -> crate::sql::Format {
        use crate::sql::Format;
        match f {
            FormatArg::Table => Format::Table,
            FormatArg::Csv => Format::Csv,
            FormatArg::Json => Format::Json,
            FormatArg::Jsonl => Format::Jsonl,
        }
    }
}
