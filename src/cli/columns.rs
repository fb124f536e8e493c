//! Plain-text tables for the operator commands: left-aligned columns, two spaces apart.

/// `rows` (the header first) as left-aligned columns two spaces apart, one line each,
/// without trailing spaces.
pub fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = [["A", "BB", "C"].map(String::from), ["long", "x", ""].map(String::from)];
        assert_eq!(columns(&rows), "A     BB  C\nlong  x\n");
    }
}
