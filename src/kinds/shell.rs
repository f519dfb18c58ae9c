//! A container's command as words: `command` + `args`, and the script of a
//! `sh -c` / `bash -c` split the way a POSIX shell splits words (quotes,
//! backslashes, line continuations) into the simple commands it runs. No
//! expansion: a word that holds `$` is kept as written, and whoever reads it
//! as a number says it cannot.

/// Longest script we split; a container's command longer than this is not read.
pub const MAX_SCRIPT: usize = 64 * 1024;

/// The simple commands a container runs, each as its words: `command` +
/// `args` as one, or, for `sh -c SCRIPT` (bash, with `-l`, `-e`, ... flags),
/// the commands of SCRIPT, split at `;`, `&&`, `||`, `|` and newlines.
pub fn commands(argv: &[String]) -> Result<Vec<Vec<String>>, String> {
    let Some(first) = argv.first() else {
        return Ok(Vec::new());
    };
    let shell = matches!(basename(first), "sh" | "bash" | "dash" | "zsh");
    if shell {
        // sh [-flags] -c SCRIPT [name args...]
        let mut i = 1;
        while i < argv.len() && argv[i].starts_with('-') {
            let flags = &argv[i];
            i += 1;
            if flags.contains('c') && !flags.starts_with("--") {
                let Some(script) = argv.get(i) else {
                    return Err(format!("{first} {flags} without a script"));
                };
                return split_script(script);
            }
        }
        return Ok(Vec::new());
    }
    Ok(vec![argv.to_vec()])
}

/// The last path component of a program name.
pub fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Split a shell script into simple commands of words.
pub fn split_script(script: &str) -> Result<Vec<Vec<String>>, String> {
    if script.len() > MAX_SCRIPT {
        return Err(format!(
            "the script is {} bytes; vramguard reads at most {MAX_SCRIPT}",
            script.len()
        ));
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut cmd: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = script.chars().peekable();
    let end_word = |cmd: &mut Vec<String>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            cmd.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(n) => {
                    word.push(n);
                    in_word = true;
                }
                None => {}
            },
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(n) => word.push(n),
                        None => return Err("unterminated ' in the script".to_string()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('\n') => {}
                            Some(n @ ('"' | '\\' | '$' | '`')) => word.push(n),
                            Some(n) => {
                                word.push('\\');
                                word.push(n);
                            }
                            None => return Err("unterminated \" in the script".to_string()),
                        },
                        Some(n) => word.push(n),
                        None => return Err("unterminated \" in the script".to_string()),
                    }
                }
            }
            '#' if !in_word => {
                // A comment to the end of the line.
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
                if !cmd.is_empty() {
                    out.push(std::mem::take(&mut cmd));
                }
            }
            ';' | '\n' | '|' | '&' | '(' | ')' => {
                end_word(&mut cmd, &mut word, &mut in_word);
                if !cmd.is_empty() {
                    out.push(std::mem::take(&mut cmd));
                }
            }
            c if c.is_whitespace() => end_word(&mut cmd, &mut word, &mut in_word),
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut cmd, &mut word, &mut in_word);
    if !cmd.is_empty() {
        out.push(cmd);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_shell_script_splits_into_its_commands() {
        let argv = words(&[
            "/bin/bash",
            "-lc",
            "pip install trl && \\\n  accelerate launch --num_processes 8 sft.py \\\n    --model_name_or_path 'meta-llama/Llama-3.1-8B' --output_dir \"/out dir\" # done\necho ok",
        ]);
        let cmds = commands(&argv).unwrap();
        assert_eq!(cmds.len(), 3, "{cmds:?}");
        assert_eq!(cmds[0], words(&["pip", "install", "trl"]));
        assert_eq!(
            cmds[1],
            words(&[
                "accelerate",
                "launch",
                "--num_processes",
                "8",
                "sft.py",
                "--model_name_or_path",
                "meta-llama/Llama-3.1-8B",
                "--output_dir",
                "/out dir"
            ])
        );
        assert_eq!(cmds[2], words(&["echo", "ok"]));
    }

    #[test]
    fn a_plain_command_is_one_command_and_bad_quotes_are_an_error() {
        let argv = words(&["torchrun", "--nproc_per_node", "8", "train.py"]);
        assert_eq!(commands(&argv).unwrap(), vec![argv.clone()]);
        assert!(commands(&words(&["sh", "-c", "echo 'open"])).is_err());
        assert!(split_script(&"x".repeat(MAX_SCRIPT + 1)).is_err());
    }
}
