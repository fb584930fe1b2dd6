//! `swelake sql --lake L` with no query: an interactive shell, as datafusion-cli's or duckdb's.
//! Statements end with `;` and may span lines; `\d` lists the tables, `\d TABLE` a table's
//! columns with their descriptions, `\q` quits. On a terminal it keeps a history across
//! sessions; with piped input it reads the statements without prompts (a scripted session).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;

use crate::lake::Lake;
use crate::sql::Format;

const HELP: &str = "\
Statements end with `;` and may span lines (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN; the lake is
read-only). Every swelake SQL function is there, as in `swelake sql`.
  \\d          the tables, with their descriptions
  \\d TABLE    a table's columns: type, nullable, description
  \\?          this help
  \\q          quit (also: Ctrl-D, quit, exit)";

/// Runs the shell until its input ends or `\q`. Returns whether every statement succeeded.
pub async fn run(lake: &Lake, format: Format) -> Result<bool> {
    let mut shell = Shell { lake, format, ctx: None, ok: true };
    if std::io::stdin().is_terminal() {
        shell.interactive().await?;
    } else {
        let stdin = std::io::stdin();
        let mut buf = String::new();
        for line in stdin.lock().lines() {
            let line = line.context("reading the statements from standard input")?;
            if !shell.feed(&mut buf, &line).await? {
                return Ok(shell.ok);
            }
        }
        if !buf.trim().is_empty() {
            // A last statement without its `;` still runs, as psql -f does.
            shell.statement(&std::mem::take(&mut buf)).await;
        }
    }
    Ok(shell.ok)
}

struct Shell<'a> {
    lake: &'a Lake,
    format: Format,
    /// The session and when it was opened: reopened for a statement a few seconds later, so
    /// the shell sees the jobs' new commits.
    ctx: Option<(Instant, Arc<SessionContext>)>,
    ok: bool,
}

impl Shell<'_> {
    async fn interactive(&mut self) -> Result<()> {
        let mut rl = rustyline::DefaultEditor::new().context("opening the terminal")?;
        let history = history_file();
        if let Some(h) = &history {
            let _ = rl.load_history(h);
        }
        eprintln!(
            "swelake sql on {}: statements end with `;`, \\d lists the tables, \\? helps, \\q quits.",
            self.lake.location()
        );
        let mut buf = String::new();
        loop {
            let prompt = if buf.trim().is_empty() { "swelake> " } else { "     ..> " };
            match rl.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = rl.add_history_entry(line.as_str());
                    }
                    if !self.feed(&mut buf, &line).await? {
                        break;
                    }
                }
                // Ctrl-C drops the statement being typed, as in psql.
                Err(rustyline::error::ReadlineError::Interrupted) => buf.clear(),
                Err(rustyline::error::ReadlineError::Eof) => break,
                Err(e) => return Err(e).context("reading a line"),
            }
        }
        if let Some(h) = &history {
            if let Some(dir) = h.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = rl.save_history(h);
        }
        Ok(())
    }

    /// Takes one line; returns false to quit.
    async fn feed(&mut self, buf: &mut String, line: &str) -> Result<bool> {
        let t = line.trim();
        if buf.trim().is_empty() {
            if t == "\\q" || t.eq_ignore_ascii_case("quit") || t.eq_ignore_ascii_case("exit") {
                return Ok(false);
            }
            if let Some(cmd) = t.strip_prefix('\\') {
                self.meta(cmd).await;
                return Ok(true);
            }
        }
        buf.push_str(line);
        buf.push('\n');
        if t.ends_with(';') {
            self.statement(&std::mem::take(buf)).await;
        }
        Ok(true)
    }

    async fn session(&mut self) -> Result<Arc<SessionContext>> {
        match &self.ctx {
            Some((at, ctx)) if at.elapsed().as_secs() < 3 => Ok(ctx.clone()),
            _ => {
                let ctx = Arc::new(crate::sql::session(self.lake).await?);
                self.ctx = Some((Instant::now(), ctx.clone()));
                Ok(ctx)
            }
        }
    }

    fn fail(&mut self, e: anyhow::Error) {
        self.ok = false;
        eprintln!("error: {}", super::one_line(&format!("{e:#}")));
    }

    async fn statement(&mut self, sql: &str) {
        let started = Instant::now();
        let r = async {
            let ctx = self.session().await?;
            let batches = crate::sql::run_read_only(&ctx, sql.trim().trim_end_matches(';')).await?;
            let mut out = std::io::stdout().lock();
            crate::sql::write(&batches, self.format, &mut out)?;
            out.flush()?;
            anyhow::Ok(batches.iter().map(|b| b.num_rows()).sum::<usize>())
        };
        match r.await {
            Ok(n) => eprintln!("({n} row{}, {:.3} s)", if n == 1 { "" } else { "s" }, started.elapsed().as_secs_f64()),
            Err(e) => self.fail(e),
        }
    }

    async fn meta(&mut self, cmd: &str) {
        let mut words = cmd.split_whitespace();
        let r = match (words.next(), words.next()) {
            (Some("d"), None) => self.list_tables().await,
            (Some("d"), Some(table)) => self.describe(table).await,
            (Some("?") | Some("h"), _) => {
                println!("{HELP}");
                Ok(())
            }
            _ => Err(anyhow::anyhow!("unknown command \\{cmd}: \\? lists the commands")),
        };
        if let Err(e) = r {
            self.fail(e);
        }
    }

    async fn list_tables(&mut self) -> Result<()> {
        let ctx = self.session().await?;
        let names = crate::sql::table_names(&ctx);
        let describe = |n: &String| crate::schema::load(n).map(|d| first_sentence(&d.description)).unwrap_or_default();
        let descriptions: Vec<String> = names.iter().map(describe).collect();
        self.print_strings(&[("table", names), ("description", descriptions)])
    }

    async fn describe(&mut self, table: &str) -> Result<()> {
        let ctx = self.session().await?;
        let provider = ctx
            .table_provider(table)
            .await
            .map_err(|_| anyhow::anyhow!("no table `{table}` in this lake: \\d lists them"))?;
        let doc = crate::schema::load(table).ok();
        let schema = provider.schema();
        let mut cols: [(&str, Vec<String>); 4] =
            [("column", vec![]), ("type", vec![]), ("nullable", vec![]), ("description", vec![])];
        for f in schema.fields() {
            let d = doc.as_ref().and_then(|d| d.columns.iter().find(|c| &c.name == f.name()));
            cols[0].1.push(f.name().clone());
            cols[1].1.push(d.map_or_else(|| f.data_type().to_string(), |d| d.ty.clone()));
            cols[2].1.push(if f.is_nullable() { "yes" } else { "no" }.to_string());
            cols[3].1.push(d.map(|d| first_sentence(&d.description)).unwrap_or_default());
        }
        if let Some(d) = &doc {
            println!("{}: {}", table, first_sentence(&d.description));
        }
        self.print_strings(&cols)
    }

    fn print_strings(&self, cols: &[(&str, Vec<String>)]) -> Result<()> {
        let schema = Schema::new(cols.iter().map(|(n, _)| Field::new(*n, DataType::Utf8, false)).collect::<Vec<_>>());
        let arrays = cols.iter().map(|(_, v)| Arc::new(StringArray::from(v.clone())) as _).collect();
        let batch = RecordBatch::try_new(Arc::new(schema), arrays)?;
        crate::sql::write(&[batch], Format::Table, std::io::stdout().lock())
    }
}

/// A description's first sentence on one line: the listing stays one row per column.
fn first_sentence(s: &str) -> String {
    let flat = super::one_line(s);
    match flat.find(". ") {
        Some(i) => flat[..=i].to_string(),
        None => flat,
    }
}

/// `$XDG_STATE_HOME/swelake/sql_history`, else `~/.local/state/swelake/sql_history`.
fn history_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("swelake").join("sql_history"))
}
