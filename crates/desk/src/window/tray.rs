//! The tray, a StatusNotifierItem spoken over D-Bus (`ksni`, no GTK): the count of waiting
//! requests, Show and Quit.

use super::Windowed;

/// The tray: the count of waiting requests, Show and Quit.
pub struct Tray {
    pub(super) title: String,
    pub(super) windowed: std::sync::Weak<Windowed>,
    /// The tray runs on a thread of its own; what it asks for runs on the desk's runtime.
    pub(super) rt: tokio::runtime::Handle,
}

impl Tray {
    fn show(&self) {
        if let Some(windowed) = self.windowed.upgrade() {
            self.rt.spawn(async move { windowed.show() });
        }
    }
}

impl ksni::Tray for Tray {
    fn id(&self) -> String {
        "countersign".into()
    }
    fn title(&self) -> String {
        self.title.clone()
    }
    fn icon_name(&self) -> String {
        "countersign-desk".into()
    }
    fn tool_tip(&self) -> ksni::ToolTip {
        ksni::ToolTip {
            title: self.title.clone(),
            ..Default::default()
        }
    }
    fn activate(&mut self, _x: i32, _y: i32) {
        self.show();
    }
    fn menu(&self) -> Vec<ksni::MenuItem<Self>> {
        use ksni::menu::StandardItem;
        vec![
            StandardItem {
                label: "Show".into(),
                activate: Box::new(|tray: &mut Tray| tray.show()),
                ..Default::default()
            }
            .into(),
            StandardItem {
                label: "Quit Countersign".into(),
                activate: Box::new(|tray: &mut Tray| {
                    if let Some(windowed) = tray.windowed.upgrade() {
                        windowed.quit.notify_one();
                    }
                }),
                ..Default::default()
            }
            .into(),
        ]
    }
    // No tray host (a bare X server, a desktop without one): the desk works without a tray.
    fn watcher_offline(&self, reason: ksni::OfflineReason) -> bool {
        tracing::debug!(target: "desk", ?reason, "no tray host");
        true
    }
}
