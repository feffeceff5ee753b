//! The ASCII tables etcdctl prints with olekukonko/tablewriter (centered upper-case headers,
//! right-aligned cells).

/// tablewriter's header formatting: `_` becomes a space, then upper case.
fn title(h: &str) -> String {
    let t = h.replace('_', " ");
    let t = t.trim();
    if t.is_empty() && !h.is_empty() {
        return " ".to_string();
    }
    t.to_uppercase()
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// Renders a table with a header row, a separator, and right-aligned cells.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| title(h)).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(width(cell));
            }
        }
    }
    let mut line = String::from("+");
    for w in &widths {
        line.push_str(&"-".repeat(w + 2));
        line.push('+');
    }
    line.push('\n');

    let mut out = line.clone();
    out.push('|');
    for (h, w) in header.iter().zip(&widths) {
        let gap = w - width(h);
        let left = gap / 2;
        out.push_str(&format!(
            " {}{}{} |",
            " ".repeat(left),
            h,
            " ".repeat(gap - left)
        ));
    }
    out.push('\n');
    out.push_str(&line);
    for row in rows {
        out.push('|');
        for (i, w) in widths.iter().enumerate() {
            let cell = row.get(i).map(String::as_str).unwrap_or("");
            out.push_str(&format!(" {}{} |", " ".repeat(w - width(cell)), cell));
        }
        out.push('\n');
    }
    out.push_str(&line);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_table() {
        let t = render(
            &["endpoint", "health", "took", "error"],
            &[vec![
                "127.0.0.1:23790".into(),
                "true".into(),
                "1.868515ms".into(),
                "".into(),
            ]],
        );
        let want = "\
+-----------------+--------+------------+-------+
|    ENDPOINT     | HEALTH |    TOOK    | ERROR |
+-----------------+--------+------------+-------+
| 127.0.0.1:23790 |   true | 1.868515ms |       |
+-----------------+--------+------------+-------+
";
        assert_eq!(t, want);
    }
}
