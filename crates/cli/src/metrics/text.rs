//! The Prometheus text exposition format (version 0.0.4): metric families
//! with `# HELP` and `# TYPE` lines and labelled samples. Written by hand:
//! the counters already live in pollux's own structures (runtime threads,
//! bdevs, the target), and copying them into an exporter crate's registry
//! on every scrape would add nothing but a second copy.
use std::fmt::Write;

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// A text exposition being written.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

/// `\`, `"` and newlines escaped, as label values need.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// `\` and newlines escaped, as HELP text needs.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

impl Exposition {
    /// Starts family `name` (`pollux_` prefixed by the caller; counters end
    /// in `_total`).
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> Family<'_> {
        let t = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {t}");
        Family {
            out: &mut self.out,
            name: name.to_string(),
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// One family's samples.
pub struct Family<'a> {
    out: &'a mut String,
    name: String,
}

impl Family<'_> {
    /// A sample with `labels` (name, value).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(&self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
        self
    }
}

/// A sample value: integers without a fraction, NaN and infinities as the
/// format spells them.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_samples_in_the_text_format() {
        let mut e = Exposition::default();
        e.family("pollux_bdev_read_ops_total", Kind::Counter, "Reads.\nDone")
            .sample(&[("bdev", "Null0")], 12.0)
            .sample(&[("bdev", "a\"b\\c\nd")], 1.5);
        e.family("pollux_up", Kind::Gauge, "Up.").sample(&[], 1.0);
        assert_eq!(
            e.finish(),
            "# HELP pollux_bdev_read_ops_total Reads.\\nDone\n\
             # TYPE pollux_bdev_read_ops_total counter\n\
             pollux_bdev_read_ops_total{bdev=\"Null0\"} 12\n\
             pollux_bdev_read_ops_total{bdev=\"a\\\"b\\\\c\\nd\"} 1.5\n\
             # HELP pollux_up Up.\n\
             # TYPE pollux_up gauge\n\
             pollux_up 1\n"
        );
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
