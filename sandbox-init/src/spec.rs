//! The job spec: one JSON line on stdin, parsed and validated into a [`Job`].
//!
//! Everything here is pure (no file system, no processes) so that the trust boundary, notably
//! file-name validation, can be tested exhaustively.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;

use base64::Engine as _;
use thiserror::Error;

mod proxy;

pub use proxy::{validate_listen, validate_socket_path, ListenError, Proxy, MAX_SOCKET_PATH_LEN};

/// Longest accepted spec line, in bytes, not counting the final newline.
pub const MAX_SPEC_LINE: usize = 64 * 1024 * 1024;
/// Working directory when the spec names none.
pub const DEFAULT_CWD: &str = "/workspace";
/// Permission bits of a file when the spec names none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// The only top-level directories files may be written under (the sandbox's writable mounts).
pub const WRITABLE_ROOTS: [&str; 3] = ["workspace", "tmp", "output"];
/// Longest accepted path, in bytes (Linux `PATH_MAX` less the NUL).
pub const MAX_PATH_LEN: usize = 4095;
/// Longest accepted path component, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// Highest accepted file mode: permission bits only, no setuid, setgid or sticky bit.
pub const MAX_FILE_MODE: u32 = 0o777;

/// The wire form is [`sandbox_protocol::Job`], the one definition both sides share.
type WireJob<'a> = sandbox_protocol::Job<'a>;
type WireFile<'a> = sandbox_protocol::JobFile<'a>;

/// A validated job: safe to act on.
#[derive(Debug, PartialEq, Eq)]
pub struct Job {
    /// Program (looked up in `PATH` when it has no `/`) and its arguments; never empty.
    pub argv: Vec<String>,
    /// Absolute, normalised working directory.
    pub cwd: PathBuf,
    /// The program's whole environment; `None`: the init's own (the container's).
    pub env: Option<BTreeMap<String, String>>,
    /// Files to create before the program starts, in spec order.
    pub files: Vec<JobFile>,
    /// The proxy bridge to start before the program; `None`: no bridge.
    pub proxy: Option<Proxy>,
    /// With it, the init's last stderr bytes are `\0sandgate-exit:<nonce>:<code>\n`: the
    /// gateway's proof that the init saw the end. The program never sees the nonce.
    pub exit_nonce: Option<String>,
}

/// One file to create: path validated by [`validate_file_path`], content decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct JobFile {
    pub path: PathBuf,
    pub content: Vec<u8>,
    pub mode: u32,
}

/// Why a spec was refused. Every message is one line: untrusted text is escaped and truncated.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("reading the job spec from stdin: {0}")]
    Read(std::io::Error),
    #[error("no job spec on stdin")]
    Empty,
    #[error("job spec line is longer than {MAX_SPEC_LINE} bytes")]
    TooLong,
    #[error("job spec is not valid: {0}")]
    Json(serde_json::Error),
    #[error("argv is empty")]
    EmptyArgv,
    #[error("argv[0] is empty")]
    EmptyProgram,
    #[error("argv[{index}] contains a NUL byte")]
    NulInArg { index: usize },
    #[error("env \"{name}\": names must be non-empty without '=' or NUL, values without NUL")]
    Env { name: String },
    #[error("cwd \"{cwd}\": {reason}")]
    Cwd { cwd: String, reason: PathError },
    #[error("file path \"{path}\": {reason}")]
    FilePath { path: String, reason: PathError },
    #[error("file \"{path}\": content_b64 is not valid base64: {err}")]
    Base64 {
        path: String,
        err: base64::DecodeError,
    },
    #[error("file \"{path}\": mode {mode:#o} is not within 0o777")]
    Mode { path: String, mode: u32 },
    #[error("proxy listen \"{listen}\": {reason}")]
    ProxyListen { listen: String, reason: ListenError },
    #[error("proxy socket \"{socket}\": {reason}")]
    ProxySocket { socket: String, reason: PathError },
    #[error("exit_nonce must be {MIN_NONCE} to {MAX_NONCE} ASCII letters or digits")]
    ExitNonce,
}

/// Bounds on `exit_nonce`.
pub const MIN_NONCE: usize = 16;
pub const MAX_NONCE: usize = 64;

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("is not absolute")]
    NotAbsolute,
    #[error("contains a control character")]
    ControlChar,
    #[error("is longer than {MAX_PATH_LEN} bytes")]
    TooLong,
    #[error("has a component longer than {MAX_NAME_LEN} bytes")]
    NameTooLong,
    #[error("has an empty component")]
    EmptyComponent,
    #[error("has a '.' component")]
    CurDir,
    #[error("has a '..' component")]
    ParentDir,
    #[error("must name a file under /workspace/, /tmp/ or /output/")]
    OutsideWritableRoots,
    #[error("is longer than {MAX_SOCKET_PATH_LEN} bytes, the limit of a Unix socket address")]
    SocketTooLong,
}

/// Reads one line of at most `limit` bytes (plus its newline). The newline is optional at end
/// of input. Bytes after the newline are left unread (or in `reader`'s buffer).
pub fn read_spec_line(reader: impl BufRead, limit: usize) -> Result<Vec<u8>, SpecError> {
    let mut line = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(cap)
        .read_until(b'\n', &mut line)
        .map_err(SpecError::Read)?;
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    if line.len() > limit {
        return Err(SpecError::TooLong);
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(SpecError::Empty);
    }
    Ok(line)
}

/// Parses and validates a spec line. Nothing is acted on unless all of it is valid.
pub fn parse_job(line: &[u8]) -> Result<Job, SpecError> {
    let wire: WireJob = serde_json::from_slice(line).map_err(SpecError::Json)?;
    validate_argv(&wire.argv)?;
    if let Some(env) = &wire.env {
        validate_env(env)?;
    }
    let cwd = match wire.cwd {
        None => PathBuf::from(DEFAULT_CWD),
        Some(cwd) => validate_cwd(&cwd).map_err(|reason| SpecError::Cwd {
            cwd: shown(&cwd),
            reason,
        })?,
    };
    let files = wire
        .files
        .into_iter()
        .map(decode_file)
        .collect::<Result<Vec<_>, _>>()?;
    let proxy = wire.proxy.map(proxy::validate).transpose()?;
    if let Some(nonce) = &wire.exit_nonce {
        let plain = (MIN_NONCE..=MAX_NONCE).contains(&nonce.len())
            && nonce.bytes().all(|byte| byte.is_ascii_alphanumeric());
        if !plain {
            return Err(SpecError::ExitNonce);
        }
    }
    Ok(Job {
        argv: wire.argv,
        cwd,
        env: wire.env,
        files,
        proxy,
        exit_nonce: wire.exit_nonce,
    })
}

/// Names must be non-empty without `=` or NUL; values without NUL (exec could not pass them).
fn validate_env(env: &BTreeMap<String, String>) -> Result<(), SpecError> {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(SpecError::Env { name: shown(name) });
        }
    }
    Ok(())
}

fn validate_argv(argv: &[String]) -> Result<(), SpecError> {
    let program = argv.first().ok_or(SpecError::EmptyArgv)?;
    if program.is_empty() {
        return Err(SpecError::EmptyProgram);
    }
    // Other control characters are legitimate in arguments (`python3 -c "...\n..."`).
    match argv.iter().position(|arg| arg.contains('\0')) {
        Some(index) => Err(SpecError::NulInArg { index }),
        None => Ok(()),
    }
}

fn decode_file(file: WireFile<'_>) -> Result<JobFile, SpecError> {
    let path = validate_file_path(&file.path).map_err(|reason| SpecError::FilePath {
        path: shown(&file.path),
        reason,
    })?;
    let mode = file.mode.unwrap_or(DEFAULT_FILE_MODE);
    if mode > MAX_FILE_MODE {
        return Err(SpecError::Mode {
            path: shown(&file.path),
            mode,
        });
    }
    let content = base64::engine::general_purpose::STANDARD
        .decode(file.content_b64.as_bytes())
        .map_err(|err| SpecError::Base64 {
            path: shown(&file.path),
            err,
        })?;
    Ok(JobFile {
        path,
        content,
        mode,
    })
}

/// Accepts `/workspace/…`, `/tmp/…` or `/output/…` naming something strictly below that root,
/// spelled canonically: no empty, `.` or `..` component, no trailing `/`, no control character
/// (NUL included), at most [`MAX_PATH_LEN`] bytes and [`MAX_NAME_LEN`] bytes per component.
/// Symlinks are a file-system matter, refused when the file is written.
pub fn validate_file_path(path: &str) -> Result<PathBuf, PathError> {
    let components = normal_components(path)?;
    match components.as_slice() {
        [root, _, ..] if WRITABLE_ROOTS.contains(root) => Ok(PathBuf::from(path)),
        _ => Err(PathError::OutsideWritableRoots),
    }
}

/// Accepts any absolute path spelled canonically (as [`validate_file_path`], any location,
/// `/` included). Whether it exists is checked when the init changes into it.
pub fn validate_cwd(path: &str) -> Result<PathBuf, PathError> {
    normal_components(path).map(|_| PathBuf::from(path))
}

/// Splits an absolute, canonically spelled path into its components (none for `/`).
fn normal_components(path: &str) -> Result<Vec<&str>, PathError> {
    if path.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong);
    }
    if path.chars().any(char::is_control) {
        return Err(PathError::ControlChar);
    }
    let rest = path.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    rest.split('/')
        .map(|component| match component {
            "" => Err(PathError::EmptyComponent),
            "." => Err(PathError::CurDir),
            ".." => Err(PathError::ParentDir),
            name if name.len() > MAX_NAME_LEN => Err(PathError::NameTooLong),
            name => Ok(name),
        })
        .collect()
}

/// Untrusted text made fit for a one-line message: escaped and cut to 120 characters.
pub fn shown(text: &str) -> String {
    const MAX_CHARS: usize = 120;
    let mut out: String = text
        .chars()
        .take(MAX_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().nth(MAX_CHARS).is_some() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn b64(data: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(data)
    }

    #[test]
    fn parses_the_documented_example() {
        let line = format!(
            r#"{{"argv":["python3","/tmp/sandgate/main.py"],"cwd":"/workspace","files":[{{"path":"/tmp/sandgate/main.py","content_b64":"{}","mode":420}}]}}"#,
            b64(b"print(1)\n")
        );
        let job = parse_job(line.as_bytes()).unwrap();
        assert_eq!(job.argv, ["python3", "/tmp/sandgate/main.py"]);
        assert_eq!(job.cwd, PathBuf::from("/workspace"));
        assert_eq!(
            job.files,
            [JobFile {
                path: PathBuf::from("/tmp/sandgate/main.py"),
                content: b"print(1)\n".to_vec(),
                mode: 0o644,
            }]
        );
    }

    #[test]
    fn cwd_mode_and_files_have_defaults() {
        let line = format!(
            r#"{{"argv":["sh"],"files":[{{"path":"/output/a","content_b64":"{}"}}]}}"#,
            b64(b"")
        );
        let job = parse_job(line.as_bytes()).unwrap();
        assert_eq!(job.cwd, PathBuf::from(DEFAULT_CWD));
        assert_eq!(job.files[0].mode, DEFAULT_FILE_MODE);
        assert!(job.files[0].content.is_empty());
        assert!(parse_job(br#"{"argv":["true"]}"#).unwrap().files.is_empty());
    }

    #[test]
    fn escaped_content_is_accepted_too() {
        // "aGk=" with an escaped '=' (some encoders escape more than JSON requires).
        let job = parse_job(
            br#"{"argv":["true"],"files":[{"path":"/tmp/a","content_b64":"aGk\u003d"}]}"#,
        )
        .unwrap();
        assert_eq!(job.files[0].content, b"hi");
    }

    #[test]
    fn env_is_optional_and_checked() {
        assert_eq!(parse_job(br#"{"argv":["true"]}"#).unwrap().env, None);
        let job = parse_job(br#"{"argv":["true"],"env":{"PATH":"/bin","EMPTY":""}}"#).unwrap();
        let env = job.env.unwrap();
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["EMPTY"], "");
        for line in [
            &br#"{"argv":["true"],"env":{"":"x"}}"#[..],
            br#"{"argv":["true"],"env":{"A=B":"x"}}"#,
            br#"{"argv":["true"],"env":{"A\u0000":"x"}}"#,
            br#"{"argv":["true"],"env":{"A":"x\u0000"}}"#,
        ] {
            assert!(
                matches!(parse_job(line), Err(SpecError::Env { .. })),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let wrong_type = parse_job(br#"{"argv":["true"],"env":{"A":1}}"#);
        assert!(
            matches!(wrong_type, Err(SpecError::Json(_))),
            "{wrong_type:?}"
        );
    }

    #[test]
    fn unknown_fields_are_refused_at_every_level() {
        let top = parse_job(br#"{"argv":["true"],"environment":{"A":"1"}}"#);
        assert!(matches!(top, Err(SpecError::Json(_))), "{top:?}");
        let file = parse_job(
            br#"{"argv":["true"],"files":[{"path":"/tmp/a","content_b64":"","owner":0}]}"#,
        );
        assert!(matches!(file, Err(SpecError::Json(_))), "{file:?}");
        let proxy = parse_job(
            br#"{"argv":["true"],"proxy":{"listen":"127.0.0.1:3128","socket":"/s","mode":1}}"#,
        );
        assert!(matches!(proxy, Err(SpecError::Json(_))), "{proxy:?}");
    }

    #[test]
    fn malformed_json_and_wrong_types_are_refused() {
        for line in [
            &b"not json"[..],
            b"{}",
            br#"{"argv":"true"}"#,
            br#"{"argv":["true"],"files":[{"path":"/tmp/a","content_b64":"","mode":-1}]}"#,
            br#"{"argv":["true"]} trailing"#,
            b"\xff\xfe",
        ] {
            assert!(
                matches!(parse_job(line), Err(SpecError::Json(_))),
                "{line:?}"
            );
        }
    }

    #[test]
    fn argv_must_name_a_program_without_nul() {
        assert!(matches!(
            parse_job(br#"{"argv":[]}"#),
            Err(SpecError::EmptyArgv)
        ));
        assert!(matches!(
            parse_job(br#"{"argv":[""]}"#),
            Err(SpecError::EmptyProgram)
        ));
        assert!(matches!(
            parse_job(br#"{"argv":["sh","-c","a\u0000b"]}"#),
            Err(SpecError::NulInArg { index: 2 })
        ));
        assert!(parse_job(br#"{"argv":["sh","-c","echo a\necho b"]}"#).is_ok());
    }

    #[test]
    fn bad_base64_bad_mode_and_bad_cwd_are_refused() {
        let bad_b64 =
            parse_job(br#"{"argv":["true"],"files":[{"path":"/tmp/a","content_b64":"!!"}]}"#);
        assert!(
            matches!(bad_b64, Err(SpecError::Base64 { .. })),
            "{bad_b64:?}"
        );
        for mode in [0o1777, 0o4755, 0o2755, u32::MAX] {
            let line = format!(
                r#"{{"argv":["true"],"files":[{{"path":"/tmp/a","content_b64":"","mode":{mode}}}]}}"#
            );
            assert!(
                matches!(parse_job(line.as_bytes()), Err(SpecError::Mode { .. })),
                "{mode:o}"
            );
        }
        let cwd = parse_job(br#"{"argv":["true"],"cwd":"/workspace/../etc"}"#);
        assert!(
            matches!(
                cwd,
                Err(SpecError::Cwd {
                    reason: PathError::ParentDir,
                    ..
                })
            ),
            "{cwd:?}"
        );
    }

    #[test]
    fn file_path_errors_name_the_file() {
        let err =
            parse_job(br#"{"argv":["true"],"files":[{"path":"/etc/passwd","content_b64":""}]}"#)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "file path \"/etc/passwd\": must name a file under /workspace/, /tmp/ or /output/"
        );
    }

    #[test]
    fn error_messages_stay_on_one_short_line() {
        let long = format!("/tmp/{}\n", "x".repeat(10_000));
        let line =
            serde_json::json!({"argv": ["true"], "files": [{"path": long, "content_b64": ""}]});
        let err = parse_job(line.to_string().as_bytes())
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.len() < 300, "{err}");
        let err = parse_job(br#"{"argv":["true"],"cwd":"/a\nb"}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "cwd \"/a\\nb\": contains a control character");
    }

    #[test]
    fn accepts_canonical_paths_under_the_writable_roots() {
        for path in [
            "/workspace/a",
            "/tmp/sandgate/main.py",
            "/output/x/y/z.png",
            "/tmp/.hidden",
            "/tmp/..dots",
            "/tmp/a b/ü.txt",
            "/workspace/...",
        ] {
            assert_eq!(validate_file_path(path), Ok(PathBuf::from(path)), "{path}");
        }
    }

    #[test]
    fn refuses_each_kind_of_bad_path() {
        use PathError::*;
        let long_name = format!("/tmp/{}", "n".repeat(MAX_NAME_LEN + 1));
        let long_path = format!("/tmp{}", "/d".repeat(MAX_PATH_LEN / 2));
        for (path, expected) in [
            ("", NotAbsolute),
            ("tmp/a", NotAbsolute),
            ("./tmp/a", NotAbsolute),
            ("/", OutsideWritableRoots),
            ("/etc/passwd", OutsideWritableRoots),
            ("/workspace", OutsideWritableRoots),
            ("/tmpx/a", OutsideWritableRoots),
            ("/proc/self/mem", OutsideWritableRoots),
            ("/workspace/../etc", ParentDir),
            ("/workspace/a/../../etc/passwd", ParentDir),
            ("/../tmp/a", ParentDir),
            ("/tmp/./a", CurDir),
            ("/tmp//x", EmptyComponent),
            ("//tmp/x", EmptyComponent),
            ("/tmp/x/", EmptyComponent),
            ("/tmp/a\0b", ControlChar),
            ("/tmp/a\nb", ControlChar),
            ("/tmp/a\x7fb", ControlChar),
            ("/tmp/a\u{85}b", ControlChar),
            (&long_name, NameTooLong),
            (&long_path, TooLong),
        ] {
            assert_eq!(validate_file_path(path), Err(expected), "{path:?}");
        }
    }

    #[test]
    fn length_limits_are_inclusive() {
        let name = format!("/tmp/{}", "n".repeat(MAX_NAME_LEN));
        assert!(validate_file_path(&name).is_ok());
        let mut path = String::from("/tmp");
        while path.len() + 2 <= MAX_PATH_LEN {
            path.push_str("/d");
        }
        path.push_str(&"e".repeat(MAX_PATH_LEN - path.len()));
        assert_eq!(path.len(), MAX_PATH_LEN);
        assert!(validate_file_path(&path).is_ok());
        path.push('e');
        assert_eq!(validate_file_path(&path), Err(PathError::TooLong));
    }

    #[test]
    fn cwd_may_be_anywhere_canonical() {
        for path in ["/", "/workspace", "/data/in", "/tmp"] {
            assert_eq!(validate_cwd(path), Ok(PathBuf::from(path)));
        }
        for path in [
            "workspace",
            "/workspace/",
            "/a/./b",
            "/a/../b",
            "/a//b",
            "/a\tb",
        ] {
            assert!(validate_cwd(path).is_err(), "{path:?}");
        }
    }

    /// Deterministic xorshift so the property test needs no dependency and replays exactly.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            usize::try_from(self.0 % n as u64).unwrap()
        }
    }

    /// Builds random paths from hostile pieces and checks that whatever is accepted is safe:
    /// under a writable root, below it, with no component that the kernel would resolve
    /// differently from the string, and nothing that could smuggle a second path or a NUL.
    #[test]
    fn property_accepted_paths_stay_under_a_writable_root() {
        // Each path: a prefix, a first component, then segments of separator + name. Most
        // choices are benign so that many paths pass and the near misses are close ones.
        const PREFIXES: [&str; 5] = ["/", "/", "/", "", "//"];
        const ROOTS: [&str; 9] = [
            "workspace",
            "tmp",
            "output",
            "workspace",
            "tmp",
            "etc",
            "tmpx",
            "..",
            ".",
        ];
        const SEPARATORS: [&str; 6] = ["/", "/", "/", "/", "//", ""];
        const NAMES: [&str; 16] = [
            "a", "b.txt", "main.py", "...", ".hidden", "é", "a b", "..", ".", "", "\0", "\n",
            "\u{7f}", "x/../y", "etc", "LONG",
        ];
        let long = "L".repeat(MAX_NAME_LEN + 1);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for _ in 0..200_000 {
            let mut path = String::from(PREFIXES[rng.below(PREFIXES.len())]);
            path.push_str(ROOTS[rng.below(ROOTS.len())]);
            for _ in 0..rng.below(6) {
                path.push_str(SEPARATORS[rng.below(SEPARATORS.len())]);
                match NAMES[rng.below(NAMES.len())] {
                    "LONG" => path.push_str(&long[..MAX_NAME_LEN - 1 + rng.below(3)]),
                    name => path.push_str(name),
                }
            }
            let Ok(validated) = validate_file_path(&path) else {
                continue;
            };
            accepted += 1;
            assert_eq!(validated.as_os_str(), path.as_str());
            assert!(path.len() <= MAX_PATH_LEN);
            assert!(!path.chars().any(char::is_control), "{path:?}");
            let parts: Vec<&str> = path.split('/').collect();
            assert_eq!(parts[0], "", "{path:?}");
            assert!(WRITABLE_ROOTS.contains(&parts[1]), "{path:?}");
            assert!(parts.len() >= 3, "{path:?}");
            for part in &parts[1..] {
                assert!(!matches!(*part, "" | "." | ".."), "{path:?}");
                assert!(part.len() <= MAX_NAME_LEN, "{path:?}");
            }
            // The kernel's own reading agrees: only normal components after the root.
            let normal = validated
                .components()
                .skip(1)
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            assert!(normal, "{path:?}");
            assert_eq!(validated.components().count(), parts.len(), "{path:?}");
        }
        assert!(
            accepted > 1_000,
            "generator too hostile: {accepted} accepted"
        );
    }

    #[test]
    fn reads_one_line_and_leaves_the_rest() {
        let mut input = &b"{\"argv\":[\"true\"]}\nnext line\n"[..];
        let line = read_spec_line(&mut input, MAX_SPEC_LINE).unwrap();
        assert_eq!(line, b"{\"argv\":[\"true\"]}");
        assert_eq!(input, b"next line\n");
        let unterminated = read_spec_line(&b"{}"[..], MAX_SPEC_LINE).unwrap();
        assert_eq!(unterminated, b"{}");
    }

    #[test]
    fn empty_input_is_refused() {
        for input in [&b""[..], b"\n", b"  \n{}"] {
            assert!(matches!(
                read_spec_line(input, MAX_SPEC_LINE),
                Err(SpecError::Empty)
            ));
        }
    }

    #[test]
    fn line_limit_counts_bytes_before_the_newline() {
        assert_eq!(read_spec_line(&b"abcd\n"[..], 4).unwrap(), b"abcd");
        assert_eq!(read_spec_line(&b"abcd"[..], 4).unwrap(), b"abcd");
        assert!(matches!(
            read_spec_line(&b"abcde\n"[..], 4),
            Err(SpecError::TooLong)
        ));
    }

    #[test]
    fn the_real_limit_is_64_mib() {
        let at_limit = std::io::repeat(b' ').take(MAX_SPEC_LINE as u64);
        let padded = std::io::BufReader::new(at_limit.chain(&b"{}\n"[..]));
        // 64 MiB of spaces then "{}": too long, refused without reading further.
        assert!(matches!(
            read_spec_line(padded, MAX_SPEC_LINE),
            Err(SpecError::TooLong)
        ));
        let mut exact = vec![b' '; MAX_SPEC_LINE - 2];
        exact.extend_from_slice(b"{}\n");
        let line = read_spec_line(&exact[..], MAX_SPEC_LINE).unwrap();
        assert_eq!(line.len(), MAX_SPEC_LINE);
    }
}
