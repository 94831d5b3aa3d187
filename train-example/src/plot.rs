//! `--plot run.svg`: step time and data wait per training step over the
//! run, so a reader sees at a glance whether the device ever starved.

use plotters::prelude::*;
use std::path::Path;
use std::time::Duration;

/// Per-step timings of the run.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    /// `(epoch, data wait ms, step ms)` per step.
    steps: Vec<(u64, f64, f64)>,
}

impl Timeline {
    pub(crate) fn push(&mut self, epoch: u64, wait: Duration, step: Duration) {
        self.steps
            .push((epoch, wait.as_secs_f64() * 1e3, step.as_secs_f64() * 1e3));
    }

    /// Draws the SVG.
    pub(crate) fn draw(&self, path: &Path, title: &str) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = self.steps.len().max(1);
        let top = self.steps.iter().map(|s| s.1.max(s.2)).fold(1.0, f64::max) * 1.1;
        let wait_total: f64 = self.steps.iter().map(|s| s.1).sum();
        let step_total: f64 = self.steps.iter().map(|s| s.2).sum();
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{title}: data wait {:.2}% of step time over {} steps",
                    100.0 * wait_total / (wait_total + step_total).max(1e-9),
                    self.steps.len()
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0..n, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("training step")
            .y_desc("milliseconds")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                self.steps.iter().enumerate().map(|(i, s)| (i, s.2)),
                BLUE.stroke_width(2),
            ))?
            .label("step (forward + backward + update)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                self.steps.iter().enumerate().map(|(i, s)| (i, s.1)),
                RED.stroke_width(2),
            ))?
            .label("waiting for the next batch")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        // Epoch boundaries.
        let starts: Vec<usize> = (1..self.steps.len())
            .filter(|&i| self.steps[i].0 != self.steps[i - 1].0)
            .collect();
        chart.draw_series(starts.iter().map(|&i| {
            PathElement::new(vec![(i, 0.0), (i, top)], BLACK.mix(0.25).stroke_width(1))
        }))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    }
}
