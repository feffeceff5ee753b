//! The progress line `check perf` prints while it runs, in the shape of etcdctl's
//! (cheggaaa/pb v1 with the "Bom !" format): ` 12 / 60   20.00% 00m48s`, redrawn with `\r`
//! every 200 ms on stdout, and ended with the total time and a newline. Like etcdctl, it is
//! written even when stdout is not a terminal; the bar itself (`Booom   !`) is drawn only on a
//! terminal, where pb would size it to the screen (here a fixed width).
use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use crate::gofmt::duration_string;

const BAR_WIDTH: usize = 50;

/// One rendering of the line (without the leading `\r`).
pub fn line(cur: u64, total: u64, elapsed: Duration, finished: bool, bar: bool) -> String {
    let mut s = format!(" {cur} / {total} ");
    if bar {
        let filled = (BAR_WIDTH as u64 * cur / total.max(1)) as usize;
        s.push('B');
        if filled > 0 {
            // pb draws the head of an unfinished bar as 'm'.
            let head = if cur < total { "m" } else { "o" };
            s += &"o".repeat(filled - 1);
            s += head;
        }
        s += &" ".repeat(BAR_WIDTH - filled);
        s.push('!');
    }
    s += &format!(" {:6.2}%", cur as f64 * 100.0 / total.max(1) as f64);
    if finished {
        s += &format!(
            " {}",
            duration_string(Duration::from_secs(elapsed.as_secs()))
        );
    } else if cur > 0 {
        // pb's estimate: the time per step so far times the steps left, in whole seconds.
        let left = (elapsed / cur as u32 * (total - cur) as u32).as_secs();
        s += &format!(" {:02}m{:02}s", left / 60, left % 60);
    }
    s
}

/// Counts one step per second for `total` seconds, redrawing the line as it goes.
pub async fn run(total: u64) {
    let bar = std::io::stdout().is_terminal();
    let start = Instant::now();
    let draw = |cur: u64, finished: bool| {
        let mut out = std::io::stdout().lock();
        let l = line(cur, total, start.elapsed(), finished, bar);
        let _ = write!(out, "\r{l}{}", if finished { "\n" } else { "" });
        let _ = out.flush();
    };
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
        let cur = (start.elapsed().as_secs()).min(total);
        if cur == total {
            draw(cur, true);
            return;
        }
        draw(cur, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcdctl_shapes() {
        let s = Duration::from_secs;
        assert_eq!(line(0, 60, s(0), false, false), " 0 / 60    0.00%");
        assert_eq!(line(1, 60, s(1), false, false), " 1 / 60    1.67% 00m59s");
        assert_eq!(
            line(59, 60, s(59), false, false),
            " 59 / 60   98.33% 00m01s"
        );
        assert_eq!(line(60, 60, s(60), true, false), " 60 / 60  100.00% 1m0s");
        let b = line(30, 60, s(30), false, true);
        assert!(b.starts_with(" 30 / 60 Boooo"), "{b}");
        assert!(b.contains("om    "), "{b}");
        assert!(b.ends_with("!  50.00% 00m30s"), "{b}");
    }
}
