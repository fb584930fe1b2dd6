//! `swelake ballista scheduler|executor`: a Ballista cluster that knows swelake's SQL functions.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;

use super::{default_jobs, Ctx};

#[derive(Subcommand, Debug)]
pub(crate) enum BallistaCommand {
    /// Run a scheduler until killed.
    Scheduler {
        /// Address to listen on for clients and executors.
        #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
        bind: String,
    },
    /// Run an executor until killed: it registers with the scheduler and runs tasks.
    Executor {
        /// The scheduler's address.
        #[arg(long, value_name = "HOST:PORT")]
        scheduler: String,
        /// Address of this executor's data (Arrow Flight) port.
        #[arg(long, default_value = "127.0.0.1:50051", value_name = "HOST:PORT")]
        bind: String,
        /// Its gRPC port [default: the data port + 1].
        #[arg(long, value_name = "P")]
        grpc_port: Option<u16>,
        /// Tasks it runs at once [default: the number of cores].
        #[arg(long, value_name = "N")]
        concurrent_tasks: Option<usize>,
        /// Where it keeps shuffle files [default: a temporary directory].
        #[arg(long, value_name = "D")]
        work_dir: Option<PathBuf>,
    },
}

impl BallistaCommand {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let options = crate::lake::store::options(&ctx.given);
        match self {
            BallistaCommand::Scheduler { bind } => crate::distributed::scheduler(&bind, &options).await?,
            BallistaCommand::Executor { scheduler, bind, grpc_port, concurrent_tasks, work_dir } => {
                let o = crate::distributed::ExecutorOptions {
                    scheduler,
                    bind,
                    grpc_port,
                    concurrent_tasks: concurrent_tasks.unwrap_or_else(default_jobs),
                    work_dir,
                };
                crate::distributed::executor(&o, &options).await?
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
