//! `--plot`: a PNG (plotters, bitmap backend only) of the target's passes:
//! mean step time (left panel) and achieved KV bandwidth (right panel)
//! against batch size, one line for decode-like passes (DECODE,
//! TARGET_VERIFY; blue) and one for prefill passes (EXTEND, MIXED; orange),
//! with a legend.
//!
//! plotters is built without font support (no system fonts are needed or
//! read): its own text rendering would panic, so every label — titles,
//! axis names, tick values — is drawn with the 3×5 pixel font of this
//! module, from filled rectangles.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{ReplayError, Result};
use crate::report::BatchPoint;

/// 3×5 glyphs: five rows of three bits (bit 2 = left column).
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 2, 2],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        '/' => [1, 1, 2, 4, 4],
        '-' => [0, 0, 7, 0, 0],
        '(' => [2, 4, 4, 4, 2],
        ')' => [2, 1, 1, 1, 2],
        ':' => [0, 2, 0, 2, 0],
        'A' => [2, 5, 7, 5, 5],
        'B' => [6, 5, 6, 5, 6],
        'C' => [3, 4, 4, 4, 3],
        'D' => [6, 5, 5, 5, 6],
        'E' => [7, 4, 6, 4, 7],
        'F' => [7, 4, 6, 4, 4],
        'G' => [3, 4, 5, 5, 3],
        'H' => [5, 5, 7, 5, 5],
        'I' => [7, 2, 2, 2, 7],
        'J' => [1, 1, 1, 5, 2],
        'K' => [5, 5, 6, 5, 5],
        'L' => [4, 4, 4, 4, 7],
        'M' => [5, 7, 7, 5, 5],
        'N' => [6, 5, 5, 5, 5],
        'O' => [2, 5, 5, 5, 2],
        'P' => [6, 5, 6, 4, 4],
        'Q' => [2, 5, 5, 6, 3],
        'R' => [6, 5, 6, 5, 5],
        'S' => [3, 4, 2, 1, 6],
        'T' => [7, 2, 2, 2, 2],
        'U' => [5, 5, 5, 5, 7],
        'V' => [5, 5, 5, 5, 2],
        'W' => [5, 5, 7, 7, 5],
        'X' => [5, 5, 2, 5, 5],
        'Y' => [5, 5, 2, 2, 2],
        'Z' => [7, 1, 2, 4, 7],
        _ => [0; 5],
    }
}

/// Width in pixels of `s` drawn at `scale`.
fn text_width(s: &str, scale: i32) -> i32 {
    s.chars().count() as i32 * 4 * scale
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_text(
    area: &Area<'_>,
    s: &str,
    (x, y): (i32, i32),
    scale: i32,
    color: RGBColor,
) -> Result<()> {
    let mut cx = x;
    for c in s.chars() {
        for (r, bits) in glyph(c).iter().enumerate() {
            for col in 0..3 {
                if bits & (4 >> col) != 0 {
                    let px = cx + col * scale;
                    let py = y + r as i32 * scale;
                    area.draw(&Rectangle::new(
                        [(px, py), (px + scale - 1, py + scale - 1)],
                        color.filled(),
                    ))
                    .map_err(draw_err)?;
                }
            }
        }
        cx += 4 * scale;
    }
    Ok(())
}

fn draw_err<E: std::fmt::Debug>(e: E) -> ReplayError {
    ReplayError::Output {
        what: "plot",
        path: String::new(),
        detail: format!("{e:?}"),
    }
}

/// A "nice" upper bound (1, 2, 2.5, 3, 4, 5, 6 or 8 × 10^k) at or above
/// `x` (so a batch axis up to 256 ends at 300, not 500).
pub fn nice_max(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * p >= x * 0.999_999 {
            return m * p;
        }
    }
    10.0 * p
}

/// A tick label with as many decimals as the tick step (`step`) needs, so
/// neighbouring ticks never print alike.
fn tick_label(v: f64, step: f64) -> String {
    if !(step.is_finite() && step > 0.0) || step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 1e-4 {
        // Enough decimals to print the step itself exactly (0.016 → 3).
        let mut decimals = (-step.log10()).ceil().max(1.0) as i32;
        while decimals < 6 {
            let scale = 10f64.powi(decimals);
            if ((step * scale).round() - step * scale).abs() < 1e-6 {
                break;
            }
            decimals += 1;
        }
        let decimals = decimals as usize;
        format!("{v:.decimals$}")
    } else {
        format!("{v:.1e}").to_uppercase()
    }
}

/// One line of a panel.
struct Series<'a> {
    name: &'a str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Draws one panel: each series' `(x, y)` points, axes with 5 ticks each,
/// a title and a legend.
fn panel(area: &Area<'_>, title: &str, xname: &str, series: &[Series<'_>]) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    let (w, h) = (w as i32, h as i32);
    let (left, right, top, bottom) = (80, 20, 40, 50);
    let (x0, x1, y0, y1) = (left, w - right, h - bottom, top);
    draw_text(area, title, ((w - text_width(title, 2)) / 2, 10), 2, BLACK)?;
    draw_text(
        area,
        xname,
        ((x0 + x1 - text_width(xname, 2)) / 2, h - 18),
        2,
        BLACK,
    )?;
    let all = || series.iter().flat_map(|s| s.points.iter());
    let xmax = nice_max(all().map(|p| p.0).fold(0.0, f64::max));
    let ymax = nice_max(all().map(|p| p.1).fold(0.0, f64::max));
    let px = |x: f64| x0 + ((x / xmax) * f64::from(x1 - x0)).round() as i32;
    let py = |y: f64| y0 - ((y / ymax) * f64::from(y0 - y1)).round() as i32;
    let grey = RGBColor(220, 220, 220);
    for i in 0..=5 {
        let (xv, yv) = (xmax * f64::from(i) / 5.0, ymax * f64::from(i) / 5.0);
        let (gx, gy) = (px(xv), py(yv));
        area.draw(&PathElement::new(vec![(gx, y0), (gx, y1)], grey))
            .map_err(draw_err)?;
        area.draw(&PathElement::new(vec![(x0, gy), (x1, gy)], grey))
            .map_err(draw_err)?;
        let xl = tick_label(xv, xmax / 5.0);
        draw_text(area, &xl, (gx - text_width(&xl, 2) / 2, y0 + 8), 2, BLACK)?;
        let yl = tick_label(yv, ymax / 5.0);
        draw_text(area, &yl, (x0 - 8 - text_width(&yl, 2), gy - 5), 2, BLACK)?;
    }
    area.draw(&PathElement::new(vec![(x0, y1), (x0, y0), (x1, y0)], BLACK))
        .map_err(draw_err)?;
    for (k, s) in series.iter().enumerate() {
        let pix: Vec<(i32, i32)> = s.points.iter().map(|&(x, y)| (px(x), py(y))).collect();
        for e in LineSeries::new(pix.iter().copied(), s.color.stroke_width(2)) {
            area.draw(&e).map_err(draw_err)?;
        }
        for &p in &pix {
            area.draw(&Circle::new(p, 3, s.color.filled()))
                .map_err(draw_err)?;
        }
        let ly = y1 + 8 + 16 * k as i32;
        area.draw(&Rectangle::new(
            [(x0 + 12, ly), (x0 + 30, ly + 9)],
            s.color.filled(),
        ))
        .map_err(draw_err)?;
        draw_text(area, s.name, (x0 + 38, ly), 2, BLACK)?;
    }
    Ok(())
}

/// Writes the PNG: step time (ms) and bandwidth (GB/s) against batch size.
///
/// # Errors
/// [`ReplayError::Output`] when the file cannot be drawn or written.
pub fn write_png(path: &Path, points: &[BatchPoint], time_domain: &str) -> Result<()> {
    let with_path = |e: ReplayError| match e {
        ReplayError::Output { what, detail, .. } => ReplayError::Output {
            what,
            path: path.display().to_string(),
            detail,
        },
        other => other,
    };
    let draw = || -> Result<()> {
        let root = BitMapBackend::new(path, (1280, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (l, r) = root.split_horizontally(640);
        let lines = |f: fn(&BatchPoint) -> f64| -> Vec<Series<'static>> {
            [
                ("decode", "DECODE/VERIFY", RGBColor(31, 119, 180)),
                ("prefill", "EXTEND/MIXED", RGBColor(255, 127, 14)),
            ]
            .into_iter()
            .map(|(key, name, color)| Series {
                name,
                color,
                points: points
                    .iter()
                    .filter(|p| p.series == key)
                    .map(|p| (p.batch_size as f64, f(p)))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
        };
        let host = if time_domain.starts_with("host") {
            " (HOST)"
        } else {
            ""
        };
        panel(
            &l,
            &format!("STEP TIME MS{host}"),
            "BATCH SIZE",
            &lines(|p| p.mean_step_ms),
        )?;
        panel(
            &r,
            &format!("KV BANDWIDTH GB/S{host}"),
            "BATCH SIZE",
            &lines(|p| p.bandwidth_gbps),
        )?;
        root.present().map_err(draw_err)?;
        Ok(())
    };
    draw().map_err(with_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks of every nice maximum print distinct and exact labels.
    #[test]
    fn tick_labels_follow_the_step() {
        assert_eq!(tick_label(0.016, 0.008), "0.016");
        assert_eq!(tick_label(0.024, 0.008), "0.024");
        assert_eq!(tick_label(60.0, 60.0), "60");
        assert_eq!(tick_label(1.5, 0.5), "1.5");
        for max in [0.04, 0.08, 0.3, 2.5, 6.0, 300.0, 5000.0] {
            let labels: Vec<String> = (0..=5)
                .map(|i| tick_label(max * f64::from(i) / 5.0, max / 5.0))
                .collect();
            for w in labels.windows(2) {
                assert_ne!(w[0], w[1], "max {max}: {labels:?}");
            }
        }
    }

    #[test]
    fn nice_bounds() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 8.0);
        assert_eq!(nice_max(256.0), 300.0);
        assert_eq!(nice_max(9.0), 10.0);
        assert_eq!(nice_max(1.5), 2.0);
        assert_eq!(nice_max(230.0), 250.0);
        assert!((nice_max(0.031) - 0.04).abs() < 1e-12);
    }

    #[test]
    fn png_without_fonts() {
        let dir = std::env::temp_dir().join(format!("mha-replay-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("p.png");
        let pts: Vec<BatchPoint> = (1..6)
            .map(|b| BatchPoint {
                series: if b % 2 == 0 { "decode" } else { "prefill" }.into(),
                batch_size: b * 3,
                passes: 1,
                mean_step_ms: 0.5 * b as f64,
                bandwidth_gbps: 0.01 * (b * b) as f64,
            })
            .collect();
        write_png(&p, &pts, "host wall time").unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        write_png(&p, &[], "host wall time").unwrap();
        let bad = write_png(&dir.join("no/such/dir/p.png"), &pts, "x").unwrap_err();
        assert!(bad.to_string().contains("no/such/dir"), "{bad}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
