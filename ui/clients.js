// Settings → Clients: every MCP client Countersign knows, those found on this account first (what
// `countersign clients` prints), with Protect and Restore (what `countersign install` and
// `uninstall` do), and what each printed. Each entry Protect leaves alone is listed with why and
// the next move. Paths, entries and the summary arrive escaped and flagged (Shown) and go on
// screen as textContent.
import * as api from "./api.js";
import { plainNode, shownNode } from "./shown.js";

const $ = (id) => document.getElementById(id);

let busy = false;

function showError(e) {
  $("cl-error").textContent = e ? (e.message || String(e)) : "";
}

function count(c) {
  if (!c.exists) return "no configuration there";
  if (c.problem) return "";
  const parts = [`${c.servers} server${c.servers === 1 ? "" : "s"}`, `${c.protected} through Countersign`];
  if (c.left) parts.push(`${c.left} left as ${c.left === 1 ? "it is" : "they are"}`);
  return parts.join(", ");
}

function clientRow(c) {
  const tr = document.createElement("tr");
  tr.dataset.client = c.id;
  tr.dataset.exists = String(c.exists);
  tr.append(plainNode("td", c.title));
  const where = document.createElement("td");
  where.append(shownNode("code", c.path));
  tr.append(where);
  const servers = plainNode("td", count(c), "cl-count");
  if (c.problem) servers.append(shownNode("div", c.problem));
  if (c.left_alone.length) servers.append(leftAlone(c.left_alone));
  tr.append(servers);
  const actions = document.createElement("td");
  const protect = plainNode("button", "Protect", "cl-protect");
  protect.type = "button";
  protect.disabled = busy || !c.exists || !!c.problem || c.servers - c.protected - c.left === 0;
  protect.addEventListener("click", () => act(c.id, () => api.protectClient(c.id)));
  const restore = plainNode("button", "Restore", "cl-restore");
  restore.type = "button";
  restore.disabled = busy || !c.exists;
  restore.addEventListener("click", () => act(c.id, () => api.restoreClient(c.id, false)));
  const force = plainNode("button", "Restore anyway: edits made since Protect are lost", "cl-restore-force danger");
  force.type = "button";
  force.hidden = true;
  force.addEventListener("click", () => act(c.id, () => api.restoreClient(c.id, true)));
  actions.append(protect, restore, force);
  tr.append(actions);
  return tr;
}

// The entries Protect leaves as they are: where, why, and (when the reason does not say it) what
// to do next.
function leftAlone(entries) {
  const list = document.createElement("ul");
  list.className = "cl-left";
  for (const e of entries) {
    const item = document.createElement("li");
    item.append(shownNode("code", e.at), plainNode("span", ": "), shownNode("span", e.why));
    if (e.next) item.append(plainNode("span", " Next: "), shownNode("span", e.next));
    list.append(item);
  }
  return list;
}

function render(list) {
  $("clients").replaceChildren(...list.map(clientRow));
}

function summary(lines) {
  const pre = $("cl-summary");
  pre.replaceChildren(...lines.map((line) => shownNode("div", line)));
  pre.hidden = lines.length === 0;
}

async function act(id, step) {
  if (busy) return;
  busy = true;
  showError(null);
  summary([]);
  for (const b of document.querySelectorAll("#clients button")) b.disabled = true;
  $("cl-working").hidden = false;
  try {
    const done = await step();
    summary(done.lines);
    busy = false;
    render(done.clients);
  } catch (e) {
    showError(e);
    busy = false;
    await loadClients();
    if (e && e.code === "edited_since_install") {
      const force = document.querySelector(`#clients tr[data-client="${id}"] .cl-restore-force`);
      if (force) force.hidden = false;
    }
  } finally {
    busy = false;
    $("cl-working").hidden = true;
  }
}

export async function loadClients() {
  try {
    render(await api.clients());
  } catch (e) {
    showError(e);
  }
}
