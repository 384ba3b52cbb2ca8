// Settings → Servers: the servers registered in the desk, and the person's own Add, Edit and
// Remove, which apply at once. Every string of a server arrives from the desk escaped and
// flagged (a Shown) and goes on screen as textContent; the edit form is filled only with values
// the desk gives back as safe to show as they are (`editable`), and a field it could not fill
// keeps the value on record when left empty. A secret's value is typed into a password field,
// sent once, and never read back: left empty, the keychain's value stays.
import * as api from "./api.js";
import { plainNode, shownNode } from "./shown.js";

const $ = (id) => document.getElementById(id);

/** The server the form edits (a ServerView), or null when it adds one. */
let editing = null;
/** Whether the command, working directory and URL fields keep the value on record when empty. */
let keep = { command: false, cwd: false, url: false };

function showError(e) {
  $("sv-error").textContent = e ? (e.message || String(e)) : "";
}

/** One row of the list: name, what runs (or the URL), each variable or header. */
function serverRow(s) {
  const tr = document.createElement("tr");
  tr.dataset.server = s.name;
  tr.append(shownNode("td", s.name_shown));
  const runs = document.createElement("td");
  if (s.kind === "stdio") {
    const words = document.createElement("code");
    s.command.forEach((arg, i) => words.append(i ? " " : "", shownNode("span", arg.shown)));
    runs.append(words);
    if (s.cwd) runs.append(plainNode("div", "in "), shownNode("code", s.cwd.shown));
  } else {
    runs.append(shownNode("code", s.url.shown));
  }
  const settings = document.createElement("td");
  const list = document.createElement("ul");
  list.className = "sv-settings";
  for (const setting of s.settings) {
    const li = document.createElement("li");
    li.dataset.key = setting.key.shown.text;
    li.append(shownNode("code", setting.key.shown), " = ");
    if (setting.secret) li.append(plainNode("em", "secret (in the keychain)", "secret"));
    else li.append(shownNode("code", setting.value.shown));
    list.append(li);
  }
  settings.append(list);
  const actions = document.createElement("td");
  const edit = plainNode("button", "Edit", "sv-edit");
  edit.type = "button";
  edit.addEventListener("click", () => openForm(s));
  const remove = plainNode("button", "Remove…", "sv-remove");
  remove.type = "button";
  const now = plainNode("button", "Remove now: its secrets are deleted", "sv-remove-now danger");
  now.type = "button";
  now.hidden = true;
  remove.addEventListener("click", () => { now.hidden = false; });
  now.addEventListener("click", () => removeServer(s.name));
  actions.append(edit, remove, now);
  tr.append(runs, settings, actions);
  return tr;
}

function render(list) {
  $("servers").replaceChildren(...list.map(serverRow));
  $("sv-none").hidden = list.length > 0;
}

export async function loadServers() {
  try {
    render(await api.servers());
  } catch (e) {
    showError(e);
  }
}

async function removeServer(name) {
  showError(null);
  try {
    render(await api.removeServer(name));
    if (editing && editing.name === name) closeForm();
  } catch (e) {
    showError(e);
  }
}

/** A variable or header row of the form. `setting` is a SettingView when editing. */
function settingRow(setting) {
  const row = document.createElement("div");
  row.className = "sv-setting";
  const key = document.createElement("input");
  key.type = "text";
  key.className = "sv-key";
  key.placeholder = "NAME";
  key.spellcheck = false;
  const secretLabel = document.createElement("label");
  secretLabel.className = "inline";
  const secret = document.createElement("input");
  secret.type = "checkbox";
  secret.className = "sv-secret";
  secretLabel.append(secret, " secret");
  const value = document.createElement("input");
  value.className = "sv-value";
  value.autocomplete = "off";
  value.spellcheck = false;
  const drop = plainNode("button", "✕", "sv-drop");
  drop.type = "button";
  drop.title = "Remove this one";
  drop.addEventListener("click", () => row.remove());
  // Whether an empty value keeps the one on record (a secret's, or one the form could not show).
  row.dataset.keep = "false";
  if (setting) {
    key.value = setting.key.editable ?? setting.key.shown.text;
    key.readOnly = setting.key.editable === null;
    secret.checked = setting.secret;
    if (setting.secret) {
      row.dataset.keep = "true";
      value.placeholder = "unchanged: the keychain keeps its value (type to replace it)";
    } else if (setting.value.editable !== null) {
      value.value = setting.value.editable;
    } else {
      row.dataset.keep = "true";
      value.placeholder = "unchanged: " + setting.value.shown.text;
    }
  }
  const kind = () => {
    value.type = secret.checked ? "password" : "text";
    if (!setting) value.placeholder = secret.checked ? "value (kept in the keychain)" : "value";
  };
  secret.addEventListener("change", kind);
  kind();
  row.append(key, secretLabel, value, drop);
  return row;
}

function showKind() {
  const stdio = $("sv-kind").value === "stdio";
  $("sv-stdio").hidden = !stdio;
  $("sv-http").hidden = stdio;
  $("sv-settings-head").textContent = stdio ? "Environment (the server's whole environment)" : "Headers";
}

/** Opens the form: empty to add, or filled from `s` (a ServerView) to edit it. */
function openForm(s) {
  showError(null);
  editing = s || null;
  keep = { command: false, cwd: false, url: false };
  $("sv-form-head").textContent = s ? "Edit the server" : "Add a server";
  $("sv-name").value = s ? s.name : "";
  $("sv-name").readOnly = !!s;
  $("sv-kind").value = s ? s.kind : "stdio";
  const field = (id, text, name) => {
    $(id).value = "";
    $(id).placeholder = "";
    if (!text) return;
    if (text.editable !== null) $(id).value = text.editable;
    else {
      keep[name] = true;
      $(id).placeholder = "unchanged: " + text.shown.text;
    }
  };
  $("sv-command").value = "";
  $("sv-command").placeholder = "npx\n-y\n@modelcontextprotocol/server-github";
  if (s && s.kind === "stdio") {
    if (s.command.every((a) => a.editable !== null)) {
      $("sv-command").value = s.command.map((a) => a.editable).join("\n");
    } else {
      keep.command = true;
      $("sv-command").placeholder = "unchanged: " + s.command.map((a) => a.shown.text).join(" ");
    }
  }
  field("sv-cwd", s && s.cwd, "cwd");
  field("sv-url", s && s.url, "url");
  $("sv-settings").replaceChildren(...(s ? s.settings.map(settingRow) : []));
  showKind();
  $("sv-form").hidden = false;
  $("sv-add").hidden = true;
  $("sv-name").focus();
}

function closeForm() {
  editing = null;
  // Nothing typed stays in the page, a secret least of all.
  $("sv-settings").replaceChildren();
  for (const id of ["sv-name", "sv-command", "sv-cwd", "sv-url"]) $(id).value = "";
  $("sv-form").hidden = true;
  $("sv-add").hidden = false;
}

/** The form as the desk's `save_server` takes it. */
function formValue() {
  const stdio = $("sv-kind").value === "stdio";
  const kept = (id, name) => (keep[name] && $(id).value === "" ? null : $(id).value);
  const command = kept("sv-command", "command");
  const settings = [...document.querySelectorAll("#sv-settings .sv-setting")].map((row) => {
    const value = row.querySelector(".sv-value").value;
    const secret = row.querySelector(".sv-secret").checked;
    const keeps = row.dataset.keep === "true" || secret;
    return {
      key: row.querySelector(".sv-key").value,
      secret,
      value: keeps && value === "" ? null : value,
    };
  });
  return {
    name: $("sv-name").value.trim(),
    editing: !!editing,
    kind: stdio ? "stdio" : "http",
    command: stdio ? (command === null ? null : command.split("\n").filter((w) => w !== "")) : null,
    cwd: stdio ? kept("sv-cwd", "cwd") : null,
    url: stdio ? null : kept("sv-url", "url"),
    settings,
  };
}

async function save() {
  showError(null);
  try {
    render(await api.saveServer(formValue()));
    closeForm();
  } catch (e) {
    showError(e);
  }
}

/** Settings' own tabs: General (the settings and policy), Servers, Clients. */
function subtab(name, onShow) {
  for (const t of ["general", "servers", "clients"]) {
    $("settings-" + t).hidden = t !== name;
    $("st-" + t).classList.toggle("active", t === name);
  }
  if (onShow) onShow();
}

/** Wires Settings → Servers; `onClients` loads Settings → Clients when it is shown. */
export function start({ onClients } = {}) {
  $("st-general").addEventListener("click", () => subtab("general"));
  $("st-servers").addEventListener("click", () => subtab("servers", loadServers));
  $("st-clients").addEventListener("click", () => subtab("clients", onClients));
  $("sv-add").addEventListener("click", () => openForm(null));
  $("sv-kind").addEventListener("change", showKind);
  $("sv-add-setting").addEventListener("click", () => $("sv-settings").append(settingRow(null)));
  $("sv-save").addEventListener("click", save);
  $("sv-cancel").addEventListener("click", () => { showError(null); closeForm(); });
}
