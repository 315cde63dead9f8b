//! Splitting a command line into words, for pkg-config's output and
//! FLATMEM_SYS_CMAKE_ARGS.

/// Splits `text` at whitespace outside quotes, as a POSIX shell does without
/// expansions: a backslash outside single quotes takes the next character
/// literally (pkg-config escapes spaces in paths that way), `'...'` is
/// literal, `"..."` is literal but for a backslash before `"`, `\`, `$` or a backquote. `""` is an empty
/// word.
pub fn split_shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '\'' => {
                let word = word.get_or_insert_with(String::new);
                word.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let word = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        // POSIX: inside "", a backslash escapes only these
                        '\\' => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => word.extend(['\\', c]),
                            None => word.push('\\'),
                        },
                        c => word.push(c),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}
