// The only module that talks to Rust: every `invoke` and `listen` of the window is here, with the
// shapes named in contract.json (a Rust test checks that the desk sends exactly those fields).
// Errors arrive as { code, message, wait_ms }: branch on `code`, show `message` (`wait_ms`: for
// `too_soon`, how long until the desk accepts an approve).

const tauri = window.__TAURI__;

/** @returns {Promise<Array<object>>} RequestView[] */
export const pending = () => tauri.core.invoke("pending");

/** Approve request `id`; `typedTarget` where the view asks for it. */
export const approve = (id, typedTarget) => tauri.core.invoke("approve", { id, typedTarget: typedTarget ?? null });

/** Deny request `id`, with an optional note for the agent. */
export const deny = (id, note) => tauri.core.invoke("deny", { id, note: note || null });

/** History rows, newest first. */
export const history = (query) => tauri.core.invoke("history", { query });
/** ExportView or null: how the OpenTelemetry collector of the settings fares. */
export const exportStatus = () => tauri.core.invoke("export_status");
/** SavedView { path, events }: every event saved as "jsonl" or "csv" in the desk's data folder. */
export const saveHistory = (format) => tauri.core.invoke("save_history", { format });

/** { settings: { token_minutes, approve_delay_ms, otlp_endpoint }, policy } */
export const settings = () => tauri.core.invoke("settings");

export const saveSettings = (view) => tauri.core.invoke("save_settings", { view });

export const rotateSecret = () => tauri.core.invoke("rotate_secret");

/** { secret_problem, approve_delay_ms } */
export const status = () => tauri.core.invoke("status");

/** Calls `handler()` whenever the desk holds approvals (the window was shown or focused): the
 *  engine refuses an approve until the delay has passed again. */
export const onHeld = (handler) => tauri.event.listen("approvals://held", () => handler());

/** Calls `handler(RequestView[])` whenever the queue changes. */
/** The request a countersign://request/<id> URL asked the window to show, once, as its decimal
 *  id in a string (null: none). */
export const takeFocus = () => tauri.core.invoke("take_focus");

/** A request URL was opened: take it with takeFocus. */
export const onFocus = (handler) => tauri.event.listen("queue://focus", () => handler());

export const onQueue = (handler) => tauri.event.listen("queue://changed", (event) => handler(event.payload));

/** Calls `handler(problem)` whenever the keychain stops or starts answering: `problem` is why
 *  nothing can be approved, or null when minting works again. */
export const onSecret = (handler) => tauri.event.listen("secret://status", (event) => handler(event.payload));

/** ServerView[]: the servers registered in the desk (secret values never among them). */
export const servers = () => tauri.core.invoke("servers");

/** Adds (`form.editing` false) or changes a server, at once; answers ServerView[]. A secret's
 *  value travels once, here; `null` keeps the value on record. */
export const saveServer = (form) => tauri.core.invoke("save_server", { form });

/** Removes a server and its secrets, at once; answers ServerView[]. */
export const removeServer = (name) => tauri.core.invoke("remove_server", { name });

/** ClientView[]: the MCP clients whose configuration the desk finds on this account. */
export const clients = () => tauri.core.invoke("clients");

/** Protect client `id` (what `countersign install --client ID` does); answers ClientAction:
 *  { lines: Shown[] (what it printed), clients: ClientView[] }. */
export const protectClient = (id) => tauri.core.invoke("protect_client", { id });

/** Restore client `id`'s file as it was before Protect (`force`: even when edited since). */
export const restoreClient = (id, force) => tauri.core.invoke("restore_client", { id, force: !!force });

/** OfferView or null: what may be offered beside Approve for request `id` (grants). */
export const grantOffer = (id) => tauri.core.invoke("grant_offer", { id });

/** Approve request `id` and make a grant; `widening`: { kind: "call", minutes } or
 *  { kind: "prefix", prefix, minutes }. Answers the grant's number. */
export const approveWidening = (id, typedTarget, widening) =>
  tauri.core.invoke("approve_widening", { id, typedTarget: typedTarget ?? null, widening });

/** GrantRow[]: the live grants, oldest first. */
export const grants = () => tauri.core.invoke("grants");

/** Revoke grant `id`; answers the GrantRow[] left. */
export const revokeGrant = (id) => tauri.core.invoke("revoke_grant", { id });
