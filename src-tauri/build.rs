//! Generates the desk's Tauri context, and the permissions of its own commands so that
//! capabilities can grant them per window.

/// The commands the page may invoke: the desk runs them (`countersign_headless_desk::commands::Command`).
const NAMES: [&str; 21] = include!("../crates/desk/src/commands/names.in");

fn main() {
    println!("cargo::rerun-if-changed=../crates/desk/src/commands/names.in");
    tauri_build::try_build(
        tauri_build::Attributes::new()
            .app_manifest(tauri_build::AppManifest::new().commands(&NAMES)),
    )
    .expect("tauri build script");
}
