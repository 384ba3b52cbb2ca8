//! `countersign server list|add|remove`: the registry of servers in the desk, from the command
//! line.
//!
//! A secret value (an API token in an environment variable or header) is never taken from the
//! command line, where every process of the account can read it and shell history keeps it: it is
//! read from a prompt that does not echo, or, when stdin is not a terminal, one line per secret
//! from stdin. It goes to the desk, which keeps it in the OS keychain.
//!
//! The desk decides: a new name takes effect at once, while changing or removing an existing one
//! is shown in its window and takes effect only after the person approves it; this waits and says
//! which happened.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};

use countersign_clients::Registrar;
use countersign_wire::{
    DeskError, RegistryAnswer, RegistryRequest, SecretText, ServerSpec, Setting, Upstream,
};

/// What `countersign server` can do.
#[derive(Debug, clap::Subcommand)]
pub enum ServerCommand {
    /// List the servers registered in the desk (secret values are never shown).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Register a server, or propose a change to a registered one (the person approves it in
    /// the desk's window).
    ///
    /// Examples:
    ///   countersign server add github --secret-env GITHUB_PERSONAL_ACCESS_TOKEN -- github-mcp-server stdio
    ///   countersign server add fs --env LOG=info -- npx -y @modelcontextprotocol/server-filesystem ~/projects
    ///   countersign server add api --url https://example.com/mcp --secret-header Authorization
    ///
    /// Secret values are read from a prompt, or one line each from stdin when it is not a
    /// terminal, in the order the --secret-env/--secret-header flags are given.
    #[command(verbatim_doc_comment)]
    Add {
        /// The server's name: what `countersign mcp --server NAME` reaches.
        name: String,
        /// An environment variable with a value that may sit in a file.
        #[arg(long, value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// An environment variable whose value is secret (asked for, kept in the keychain).
        #[arg(long, value_name = "KEY")]
        secret_env: Vec<String>,
        /// The working directory the desk starts the command in (absolute).
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// Reach the server over streamable HTTP at this URL instead of starting a command.
        #[arg(long, conflicts_with_all = ["command", "env", "secret_env", "cwd"])]
        url: Option<String>,
        /// A header sent to the URL with a value that may sit in a file.
        #[arg(long, value_name = "NAME: VALUE", requires = "url")]
        header: Vec<String>,
        /// A header whose value is secret (asked for, kept in the keychain).
        #[arg(long, value_name = "NAME", requires = "url")]
        secret_header: Vec<String>,
        /// The server's command and arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Remove a registered server and its secrets (the person approves it in the desk's window).
    Remove {
        /// The server's name.
        name: String,
    },
}

/// Exit codes of `countersign server`.
pub mod exit {
    /// Done (or nothing to do).
    pub const OK: i32 = 0;
    /// The desk refused, or the person denied the change.
    pub const REFUSED: i32 = 1;
    /// The command line was not usable.
    pub const USAGE: i32 = 2;
}

/// Runs `command` against `desk`, reading secrets through `secrets`, printing to `out`.
pub fn run(
    command: ServerCommand,
    desk: &mut dyn Registrar,
    secrets: &mut dyn FnMut(&str) -> std::io::Result<String>,
    out: &mut dyn Write,
) -> i32 {
    let request = match command {
        ServerCommand::List { json } => {
            return match desk.ask(RegistryRequest::List, &mut |_| {}) {
                Ok(RegistryAnswer::Servers { servers }) => {
                    print_list(&servers, json, out);
                    exit::OK
                }
                other => report(other, out),
            };
        }
        ServerCommand::Add {
            name,
            env,
            secret_env,
            cwd,
            url,
            header,
            secret_header,
            command,
        } => match spec_of(env, secret_env, cwd, url, header, secret_header, command) {
            Ok((spec, secret_keys)) => {
                let mut values = BTreeMap::new();
                for key in secret_keys {
                    match secrets(&key) {
                        Ok(value) => {
                            values.insert(key, SecretText::new(value));
                        }
                        Err(e) => {
                            eprintln!("countersign server: cannot read the value of {key}: {e}");
                            return exit::USAGE;
                        }
                    }
                }
                RegistryRequest::Put {
                    name,
                    spec,
                    secrets: values,
                }
            }
            Err(e) => {
                eprintln!("countersign server add: {e}");
                return exit::USAGE;
            }
        },
        ServerCommand::Remove { name } => RegistryRequest::Remove { name },
    };
    let answer = desk.ask(request, &mut |message| {
        let _ = writeln!(out, "{message} …");
        let _ = out.flush();
    });
    report(answer, out)
}

fn report(answer: Result<RegistryAnswer, DeskError>, out: &mut dyn Write) -> i32 {
    match answer {
        Ok(RegistryAnswer::Done { message }) => {
            let _ = writeln!(out, "{message}");
            exit::OK
        }
        Ok(RegistryAnswer::Denied { message }) => {
            eprintln!("countersign server: {message}");
            exit::REFUSED
        }
        Ok(RegistryAnswer::Refused { code, message }) => {
            eprintln!(
                "countersign server: the desk refused: {message} [{}]",
                code.code()
            );
            exit::REFUSED
        }
        Ok(other) => {
            eprintln!("countersign server: unexpected answer from the desk: {other:?}");
            exit::REFUSED
        }
        Err(e) => {
            eprintln!("countersign server: {e}");
            countersign_pipe::exit_code(&e)
        }
    }
}

/// Why the flags of `countersign server add` describe no server.
#[derive(Debug, thiserror::Error)]
enum SpecError {
    /// A setting is not split by `=` (or, for a header, `:`).
    #[error("{0:?} is not KEY=VALUE (or, for a header, NAME: VALUE)")]
    NotAPair(String),
    /// A key is given twice (plain or secret).
    #[error("{0} is given twice")]
    Twice(String),
    /// Neither a command nor a URL is given.
    #[error("give the server's command after `--`, or --url URL")]
    NoUpstream,
    /// The spec is not one the desk would run or send.
    #[error("{0}")]
    Invalid(#[source] countersign_wire::Invalid),
}

/// The spec the flags describe, and the secret keys whose values must be asked for (in order).
fn spec_of(
    env: Vec<String>,
    secret_env: Vec<String>,
    cwd: Option<String>,
    url: Option<String>,
    header: Vec<String>,
    secret_header: Vec<String>,
    command: Vec<String>,
) -> Result<(ServerSpec, Vec<String>), SpecError> {
    let mut settings = BTreeMap::new();
    /// Splits `NAME: VALUE` (a header) or `KEY=VALUE` (an environment variable).
    type Split = fn(&str) -> Option<(&str, &str)>;
    let (plain, secret, split): (_, _, Split) = if url.is_some() {
        (header, secret_header, |h| {
            h.split_once(':').map(|(k, v)| (k.trim(), v.trim_start()))
        })
    } else {
        (env, secret_env, |e| e.split_once('='))
    };
    for item in &plain {
        let (key, value) = split(item).ok_or_else(|| SpecError::NotAPair(item.clone()))?;
        if settings
            .insert(key.to_owned(), Setting::Plain(value.to_owned()))
            .is_some()
        {
            return Err(SpecError::Twice(key.to_owned()));
        }
    }
    for key in &secret {
        if settings.insert(key.clone(), Setting::Secret).is_some() {
            return Err(SpecError::Twice(key.clone()));
        }
    }
    let upstream = match url {
        Some(url) => Upstream::Http {
            url,
            headers: settings,
        },
        None if command.is_empty() => {
            return Err(SpecError::NoUpstream);
        }
        None => Upstream::Stdio {
            command,
            cwd,
            env: settings,
        },
    };
    let spec = ServerSpec { upstream };
    spec.check().map_err(SpecError::Invalid)?;
    Ok((spec, secret))
}

fn print_list(servers: &BTreeMap<String, ServerSpec>, json: bool, out: &mut dyn Write) {
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(servers).expect("specs serialize")
        );
        return;
    }
    if servers.is_empty() {
        let _ = writeln!(
            out,
            "no servers are registered (countersign server add NAME -- CMD ARGS...)"
        );
        return;
    }
    for (name, spec) in servers {
        let what = match &spec.upstream {
            Upstream::Stdio { command, .. } => command.join(" "),
            Upstream::Http { url, .. } => url.clone(),
        };
        let _ = writeln!(out, "{name}\t{what}");
        for (key, value) in spec.upstream.settings() {
            let shown = match value {
                Setting::Plain(v) => v.as_str(),
                Setting::Secret => "(secret, in the keychain)",
            };
            let _ = writeln!(out, "  {} {key} = {shown}", spec.upstream.setting_word());
        }
    }
}

/// Reads a secret value: from a prompt that does not echo when stdin is a terminal, else one
/// line of stdin (its line ending removed).
pub fn read_secret(key: &str) -> std::io::Result<String> {
    if std::io::stdin().is_terminal() {
        return rpassword::prompt_password(format!("value of {key} (not shown): "));
    }
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "stdin ended before this value",
        ));
    }
    let trimmed = line.strip_suffix('\n').unwrap_or(&line);
    Ok(trimmed.strip_suffix('\r').unwrap_or(trimmed).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registrar that records what it was asked and answers Done.
    #[derive(Default)]
    struct Recorder(Vec<RegistryRequest>);

    impl Registrar for Recorder {
        fn ask(
            &mut self,
            request: RegistryRequest,
            _: &mut dyn FnMut(&str),
        ) -> Result<RegistryAnswer, DeskError> {
            self.0.push(request);
            Ok(RegistryAnswer::Done {
                message: "ok".into(),
            })
        }
    }

    fn add(args: &[&str]) -> (i32, Recorder, String) {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: ServerCommand,
        }
        let cli =
            Cli::try_parse_from(std::iter::once("server").chain(args.iter().copied())).unwrap();
        let mut desk = Recorder::default();
        let mut out = Vec::new();
        let code = run(
            cli.command,
            &mut desk,
            &mut |key| Ok(format!("value-of-{key}")),
            &mut out,
        );
        (code, desk, String::from_utf8(out).unwrap())
    }

    #[test]
    fn secret_values_come_from_the_prompt_never_from_the_arguments() {
        let (code, desk, out) = add(&[
            "add",
            "gh",
            "--env",
            "LOG=info",
            "--secret-env",
            "TOKEN",
            "--",
            "gh-server",
            "stdio",
        ]);
        assert_eq!(code, exit::OK);
        assert_eq!(out, "ok\n");
        let RegistryRequest::Put {
            name,
            spec,
            secrets,
        } = &desk.0[0]
        else {
            panic!("{:?}", desk.0)
        };
        assert_eq!(name, "gh");
        assert_eq!(spec.upstream.settings()["TOKEN"], Setting::Secret);
        assert_eq!(
            spec.upstream.settings()["LOG"],
            Setting::Plain("info".into())
        );
        assert_eq!(secrets["TOKEN"].expose(), "value-of-TOKEN");
    }

    #[test]
    fn a_url_server_takes_headers() {
        let (code, desk, _) = add(&[
            "add",
            "api",
            "--url",
            "https://example.com/mcp",
            "--header",
            "X-Team: core",
            "--secret-header",
            "Authorization",
        ]);
        assert_eq!(code, exit::OK);
        let RegistryRequest::Put { spec, secrets, .. } = &desk.0[0] else {
            panic!()
        };
        assert_eq!(
            spec.upstream.settings()["X-Team"],
            Setting::Plain("core".into())
        );
        assert_eq!(secrets["Authorization"].expose(), "value-of-Authorization");
    }

    #[test]
    fn unusable_flags_ask_nothing_of_the_desk() {
        for args in [
            &["add", "gh"][..],
            &["add", "gh", "--env", "NOVALUE", "--", "x"],
            &["add", "gh", "--env", "A=1", "--secret-env", "A", "--", "x"],
        ] {
            let (code, desk, _) = add(args);
            assert_eq!(code, exit::USAGE, "{args:?}");
            assert!(desk.0.is_empty());
        }
    }
}
