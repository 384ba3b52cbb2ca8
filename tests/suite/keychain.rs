//! The keychain going away while the desk runs: minting stops with a banner, and tokens already
//! minted keep confirming until they expire (the desk verifies with the key it read at start;
//! those approvals were given while the keychain was there). The desk's keychain here is a
//! private Secret Service the test can take away, under the real window driven through WebDriver.

use std::time::Duration;

use countersign_tests::calls::{call, confirm_of};
use countersign_tests::keyring::PrivateKeyring;
use countersign_tests::window::Desk;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keychain_gone_stops_approving_with_a_banner_and_tokens_already_minted_still_confirm() {
    let mut keyring = PrivateKeyring::start();
    let desk = Desk::start_with(&[("DBUS_SESSION_BUS_ADDRESS", keyring.address.as_str())]).await;
    let agent = desk.agent("keychain-agent").await;

    // Approved while the keychain answers.
    let before = json!({"name": "before-the-keychain-went"});
    let preflight = call(&agent, "create_backup", before.clone());
    desk.wait_for_request().await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    let preflight = preflight.await.unwrap();
    let confirm = confirm_of(&preflight, before);
    assert!(
        !desk
            .text("#banner")
            .await
            .contains("Nothing can be approved")
    );

    keyring.kill_service();

    // A click on Approve now mints nothing: the window says why, the banner stays, the request
    // keeps waiting for a person.
    let waiting = call(
        &agent,
        "create_backup",
        json!({"name": "after-the-keychain-went"}),
    );
    desk.until("the second request", |d| {
        Box::pin(async move {
            d.text("#d-target")
                .await
                .contains("after-the-keychain-went")
        })
    })
    .await;
    desk.until("Approve to be enabled", |d| Box::pin(d.approve_enabled()))
        .await;
    desk.click("#approve").await;
    desk.until("the banner", |d| {
        Box::pin(async move {
            d.text("#banner")
                .await
                .starts_with("Nothing can be approved")
        })
    })
    .await;
    let error = desk.text("#error").await;
    assert!(error.contains("Nothing can be approved"), "{error}");
    assert!(error.contains("keep working until they expire"), "{error}");
    let pending = desk.invoke("pending", json!({})).await.unwrap();
    assert_eq!(pending.as_array().unwrap().len(), 1, "{pending}");

    // The token minted before still confirms: verification needs only the key in memory.
    let confirmed = call(&agent, "create_backup", confirm).await.unwrap();
    assert_ne!(confirmed.is_error, Some(true), "{confirmed:?}");
    assert!(
        confirmed
            .structured_content
            .as_ref()
            .and_then(|s| s.get("refusal"))
            .is_none(),
        "{confirmed:?}"
    );

    desk.click("#deny").await;
    let denied = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        denied.structured_content.as_ref().unwrap()["refusal"],
        "denied"
    );
    drop(agent);
    desk.stop().await;
}
