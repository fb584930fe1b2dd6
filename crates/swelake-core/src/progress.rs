//! Progress bars on a terminal, nothing when stderr is not one (logs, CI, cron).

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub fn multi(enabled: bool) -> MultiProgress {
    if enabled && std::io::stderr().is_terminal() {
        MultiProgress::new()
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    }
}

pub fn count_bar(len: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(&format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} (eta {{eta}})"))
            .expect("static template")
            .progress_chars("=> "),
    );
    bar
}

pub fn bytes_bar(len: u64, name: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("  {msg:28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    bar
}
