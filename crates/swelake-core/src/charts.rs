//! PNG charts for the dataset card and the training curves: labelled counts as horizontal
//! bars, histograms, and small line panels side by side.
//!
//! Each chart is drawn onto any plotters drawing area (the `draw_*` functions), so a test can
//! draw into a pixel buffer and check where the bars ended up; the `*_png` wrappers draw into
//! a file. Text uses DejaVu Sans: the system's copy, else the one in the matplotlib wheel
//! (fetched into the cache once).

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

const FONT: &str = "swelake-sans";

/// The colour of the bars of [`draw_bars`] (tests look for it).
pub const BAR: RGBColor = RGBColor(70, 110, 180);

/// Registers a TTF font for chart text, once per process.
fn ensure_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let system = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];
        let bytes = match system.iter().find(|p| Path::new(p).exists()) {
            Some(p) => std::fs::read(p).map_err(|e| e.to_string())?,
            None => {
                let p = crate::models::fetch(&crate::models::DEJAVU_SANS).map_err(|e| format!("{e:#}"))?;
                std::fs::read(p).map_err(|e| e.to_string())?
            }
        };
        // plotters keeps a registered font for the whole process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes).map_err(|_| "not a usable font".to_string())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing a chart: {e}")
}

/// Where [`draw_bars`] put one bar, in pixels of the drawing area.
#[derive(Debug, Clone, PartialEq)]
pub struct DrawnBar {
    pub label: String,
    pub count: u64,
    /// Row of the middle of the bar's slot, where its label is drawn.
    pub center_y: i32,
    /// Column where a bar of `count` ends.
    pub end_x: i32,
}

/// Size of a bar chart of `n` items, in pixels.
pub fn bars_size(n: usize) -> (u32, u32) {
    (900, 120 + 28 * n.max(1) as u32)
}

/// Labelled counts as horizontal bars, first item on top, each bar centred on its label.
pub fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    items: &[(String, u64)],
) -> Result<Vec<DrawnBar>> {
    ensure_font()?;
    root.fill(&WHITE).map_err(err)?;
    let n = items.len().max(1);
    let max = items.iter().map(|x| x.1).max().unwrap_or(0).max(1);
    // Integer axis: counts are labelled 0, 5, 10, never 5.0.
    let top = max + max / 10 + 1;
    // Slots are segments, labelled at their centres: slot i holds item n-1-i, so that the
    // first item is at the top.
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(240)
        .build_cartesian_2d(0u64..top, (0..n).into_segmented())
        .map_err(err)?;
    let label_of =
        |slot: usize| n.checked_sub(slot + 1).and_then(|i| items.get(i)).map(|x| x.0.clone()).unwrap_or_default();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(slot) => label_of(*slot),
            _ => String::new(),
        })
        .x_label_formatter(&|v| v.to_string())
        .label_style((FONT, 15))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(items.iter().enumerate().map(|(i, (_, v))| {
            let slot = n - 1 - i;
            // A small gap between neighbouring bars: the bar spans the middle 80% of its slot.
            let mut bar =
                Rectangle::new([(0, SegmentValue::Exact(slot)), (*v, SegmentValue::Exact(slot + 1))], BAR.filled());
            bar.set_margin(3, 3, 0, 0);
            bar
        }))
        .map_err(err)?;
    let drawn = items
        .iter()
        .enumerate()
        .map(|(i, (label, v))| {
            let slot = n - 1 - i;
            let (end_x, center_y) = chart.backend_coord(&(*v, SegmentValue::CenterOf(slot)));
            DrawnBar { label: label.clone(), count: *v, center_y, end_x }
        })
        .collect();
    root.present().map_err(err)?;
    Ok(drawn)
}

/// [`draw_bars`] into a PNG file.
pub fn bars_png(path: &Path, title: &str, items: &[(String, u64)]) -> Result<Vec<DrawnBar>> {
    let root = BitMapBackend::new(path, bars_size(items.len())).into_drawing_area();
    draw_bars(&root, title, items)
}

/// A histogram of `values` in `bins` equal-width bins, as a PNG file.
pub fn histogram_png(path: &Path, title: &str, x_label: &str, values: &[f64], bins: usize) -> Result<()> {
    ensure_font()?;
    let bins = bins.max(1);
    let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
    let (lo, hi) = if values.is_empty() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, hi + 0.5)
    };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0u32; bins];
    for v in values {
        let b = (((v - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(lo..hi, 0u32..top + top / 10 + 1)
        .map_err(err)?;
    chart.configure_mesh().x_desc(x_label).y_desc("PRs").label_style((FONT, 14)).draw().map_err(err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, c)| {
            let x0 = lo + width * i as f64;
            Rectangle::new([(x0, 0), (x0 + width * 0.95, *c)], RGBColor(70, 150, 110).filled())
        }))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Small line charts side by side, one per named series of (x, y) points (training curves).
pub fn line_panels_png(path: &Path, title: &str, panels: &[(&str, Vec<(f64, f64)>)]) -> Result<()> {
    ensure_font()?;
    let cols = 3usize;
    let rows = panels.len().div_ceil(cols).max(1);
    let root = BitMapBackend::new(path, (1200, 60 + 300 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, (FONT, 24)).map_err(err)?;
    let areas = root.split_evenly((rows, cols));
    for ((name, points), area) in panels.iter().zip(areas.iter()) {
        let finite: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
        let (x0, x1) = finite.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = finite.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let (x0, x1) = if finite.is_empty() {
            (0.0, 1.0)
        } else if x1 > x0 {
            (x0, x1)
        } else {
            (x0 - 0.5, x1 + 0.5)
        };
        let (y0, y1) = if finite.is_empty() {
            (0.0, 1.0)
        } else if y1 > y0 {
            let pad = (y1 - y0) * 0.05;
            (y0 - pad, y1 + pad)
        } else {
            (y0 - 0.5, y1 + 0.5)
        };
        let mut chart = ChartBuilder::on(area)
            .caption(*name, (FONT, 16))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        chart.configure_mesh().x_desc("step").label_style((FONT, 12)).draw().map_err(err)?;
        chart.draw_series(LineSeries::new(finite.iter().copied(), BAR.stroke_width(2))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws `items` into a pixel buffer; returns the buffer, its width and the layout.
    fn draw(items: &[(String, u64)]) -> (Vec<u8>, u32, Vec<DrawnBar>) {
        let (w, h) = bars_size(items.len());
        let mut buf = vec![0u8; (w * h * 3) as usize];
        let drawn = {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            draw_bars(&root, "test", items).unwrap()
        };
        (buf, w, drawn)
    }

    fn is_bar(buf: &[u8], w: u32, x: i32, y: i32) -> bool {
        let i = ((y as u32 * w + x as u32) * 3) as usize;
        buf[i..i + 3] == [BAR.0, BAR.1, BAR.2]
    }

    /// The last bar-coloured column of pixel row `y`.
    fn bar_end(buf: &[u8], w: u32, y: i32) -> Option<i32> {
        (0..w as i32).rev().find(|&x| is_bar(buf, w, x, y))
    }

    #[test]
    fn each_bar_is_centred_on_its_label_and_as_long_as_its_count() {
        let items: Vec<(String, u64)> =
            [("bot_author", 40), ("not_merged", 25), ("noise_only", 7), ("decontaminated", 1)]
                .into_iter()
                .map(|(l, n)| (l.to_string(), n))
                .collect();
        let (buf, w, drawn) = draw(&items);
        assert_eq!(
            drawn.iter().map(|d| (d.label.as_str(), d.count)).collect::<Vec<_>>(),
            [("bot_author", 40), ("not_merged", 25), ("noise_only", 7), ("decontaminated", 1)]
        );
        // First item on top.
        assert!(drawn.windows(2).all(|p| p[0].center_y < p[1].center_y), "{drawn:?}");
        let zero = drawn.iter().map(|d| d.end_x).min().unwrap();
        let slot = drawn[1].center_y - drawn[0].center_y;
        for d in &drawn {
            // The label's row runs through the bar, which ends where its count is.
            let end = bar_end(&buf, w, d.center_y).unwrap_or_else(|| panic!("no bar on the row of {}", d.label));
            assert!((end - d.end_x).abs() <= 1, "{}: bar ends at {end}, count {} is at {}", d.label, d.count, d.end_x);
            // And the bar is centred on that row: as much of it above as below.
            let above = (0..slot).take_while(|k| is_bar(&buf, w, end, d.center_y - k)).count() as i32;
            let below = (0..slot).take_while(|k| is_bar(&buf, w, end, d.center_y + k)).count() as i32;
            assert!((above - below).abs() <= 1, "{}: {above} rows above its label, {below} below", d.label);
        }
        // Bar lengths are proportional to the counts.
        let per = (drawn[0].end_x - zero) as f64 / 39.0;
        for d in &drawn {
            let want = zero as f64 + per * (d.count as f64 - 1.0);
            assert!((d.end_x as f64 - want).abs() <= 1.5, "{d:?}");
        }
    }
}
