//! Generates the desk's Tauri context, and the permissions of its own commands so that
//! capabilities can grant them per window.

fn main() {
    tauri_build::try_build(tauri_build::Attributes::new().app_manifest(
        tauri_build::AppManifest::new().commands(&[
            "pending",
            "approve",
            "deny",
            "history",
            "settings",
            "save_settings",
            "export_status",
            "save_history",
            "rotate_secret",
            "status",
            "grant_offer",
            "approve_widening",
            "grants",
            "revoke_grant",
            "servers",
            "save_server",
            "remove_server",
            "clients",
            "protect_client",
            "restore_client",
            "take_focus",
        ]),
    ))
    .expect("tauri build script");
}
