//! Colour in the human output: on a terminal only (`--color auto`, the default), never in a
//! pipe or a file, never with `NO_COLOR` set (<https://no-color.org>) or `TERM=dumb`;
//! `--color always` and `--color never` decide regardless.

use clap::ValueEnum;

/// `--color`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless NO_COLOR is set or TERM is dumb.
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// `Auto` decided for an output that is (or is not) a terminal, with the environment's
    /// `NO_COLOR` and `TERM`: `Always` or `Never`.
    pub fn resolve(self, is_terminal: bool, no_color: Option<&str>, term: Option<&str>) -> Self {
        match self {
            Self::Auto => {
                let asked_not = no_color.is_some_and(|v| !v.is_empty());
                if is_terminal && !asked_not && term != Some("dumb") {
                    Self::Always
                } else {
                    Self::Never
                }
            }
            other => other,
        }
    }

    /// `Auto` decided for standard output and this process's environment.
    pub fn for_stdout(self) -> Self {
        use std::io::IsTerminal;
        let no_color = std::env::var("NO_COLOR").ok();
        let term = std::env::var("TERM").ok();
        self.resolve(
            std::io::stdout().is_terminal(),
            no_color.as_deref(),
            term.as_deref(),
        )
    }
}

/// Wraps text in SGR escape codes when on. `Auto` not yet resolved counts as off: only
/// the binary's entry points know what standard output is.
#[derive(Clone, Copy, Debug)]
pub struct Paint(bool);

impl Paint {
    pub fn new(choice: ColorChoice) -> Self {
        Self(choice == ColorChoice::Always)
    }

    fn sgr(self, code: &str, text: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    pub fn bold(self, text: &str) -> String {
        self.sgr("1", text)
    }

    pub fn good(self, text: &str) -> String {
        self.sgr("32", text)
    }

    pub fn bad(self, text: &str) -> String {
        self.sgr("31", text)
    }

    pub fn note(self, text: &str) -> String {
        self.sgr("33", text)
    }
}

#[cfg(test)]
mod tests {
    use super::ColorChoice::*;
    use super::*;

    #[test]
    fn auto_colours_a_terminal_only() {
        assert_eq!(Auto.resolve(true, None, Some("xterm")), Always);
        assert_eq!(Auto.resolve(false, None, Some("xterm")), Never);
        assert_eq!(Auto.resolve(true, Some("1"), Some("xterm")), Never);
        // An empty NO_COLOR does not count (no-color.org).
        assert_eq!(Auto.resolve(true, Some(""), None), Always);
        assert_eq!(Auto.resolve(true, None, Some("dumb")), Never);
        assert_eq!(Always.resolve(false, Some("1"), None), Always);
        assert_eq!(Never.resolve(true, None, None), Never);
    }

    #[test]
    fn paint_writes_escapes_only_when_on() {
        assert_eq!(Paint::new(Always).good("fits"), "\x1b[32mfits\x1b[0m");
        assert_eq!(Paint::new(Never).good("fits"), "fits");
        assert_eq!(Paint::new(Auto).bad("short"), "short");
    }
}
