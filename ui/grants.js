// Grants: at the end of a request, "Approve and grant" widens one approval (this same call for
// some minutes, or this tool on targets under a prefix for this agent's session), offered only
// when the desk says the request allows it (and saying why not otherwise); and the Grants view,
// the live grants with Revoke. The desk enforces every cap itself; this page only asks.
import * as api from "./api.js";
import { plainNode, shownNode } from "./shown.js";

const $ = (id) => document.getElementById(id);

let ctx = null;
let offer = null;
let offerFor = null;

function text(id, value) {
  $(id).textContent = value;
}

/** The kinds the current offer allows, as the select shows them. `keep`: the same request
 *  shown again (updated): the person's choice and prefix stay where still allowed. */
function renderOffer(keep = false) {
  const kind = $("widen-kind");
  const allowed = { call: !!(offer && offer.call), prefix: !!(offer && offer.prefix) };
  for (const option of kind.options) {
    if (option.value) option.disabled = !allowed[option.value];
  }
  if (kind.value && !allowed[kind.value]) kind.value = "";
  $("widen").hidden = !offer;
  // Nothing to choose: only the reason is shown.
  const any = allowed.call || allowed.prefix;
  kind.hidden = !any;
  document.querySelector('label[for="widen-kind"]').hidden = !any;
  const why = [];
  if (offer && !offer.call && offer.call_why) why.push("No grant for this request: " + offer.call_why + ".");
  else if (offer && !offer.prefix && offer.prefix_why) why.push("No prefix grant: " + offer.prefix_why + ".");
  text("widen-why", why.join(" "));
  if (!keep || !$("widen-prefix").value) {
    $("widen-prefix").value = offer && offer.default_prefix ? offer.default_prefix : "";
  }
  $("widen-prefix-shown").replaceChildren(
    ...(offer && offer.default_prefix_shown && offer.default_prefix_shown.flags.length
      ? [shownNode("span", offer.default_prefix_shown)]
      : []),
  );
  renderKind();
}

function renderKind() {
  const kind = $("widen-kind").value;
  $("widen-minutes-row").hidden = !kind;
  $("widen-prefix-row").hidden = kind !== "prefix";
  refresh();
}

/** Approve and grant works when Approve does and a kind is chosen. */
export function refresh() {
  const button = $("approve-widen");
  if (!button) return;
  button.disabled = !ctx || !ctx.canApprove() || !$("widen-kind").value || !offer;
}

/** A request was selected (or the selection changed): ask the desk what it may offer. */
export async function select(request) {
  const keep = !!request && offerFor === request.id;
  if (!keep) {
    offer = null;
    offerFor = request ? request.id : null;
    $("widen-kind").value = "";
    renderOffer();
  }
  if (!request || request.change) return;
  try {
    const got = await api.grantOffer(request.id);
    if (offerFor === request.id) {
      offer = got;
      renderOffer(keep);
    }
  } catch (e) {
    if (offerFor === request.id) text("widen-why", e && e.message ? e.message : String(e));
  }
}

async function onApproveWiden() {
  const request = ctx.selected();
  if (!request || !offer || !ctx.canApprove()) return;
  const kind = $("widen-kind").value;
  const minutes = Number($("widen-minutes").value);
  const widening = kind === "prefix" ? { kind, prefix: $("widen-prefix").value, minutes } : { kind, minutes };
  try {
    await api.approveWidening(request.id, ctx.typed(), widening);
  } catch (e) {
    if (e && e.code === "too_soon") ctx.onTooSoon(e.wait_ms || 0);
    else ctx.showError(e);
  }
}

/** A time: the clock alone when it is today, else date and clock. */
function when(ms) {
  const d = new Date(ms);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}

/** The Covers cell: what the grant covers, and for a session grant, whose session. */
function covers(what, g) {
  const cell = plainNode("td", what);
  if (g.agent) cell.append(shownNode("span", g.agent));
  if (g.works_once) cell.append(" (each token works once)");
  return cell;
}

/** The Grants view: every live grant, with Revoke. */
export async function loadGrants(rows) {
  text("gr-error", "");
  let list = rows;
  if (!list) {
    try {
      list = await api.grants();
    } catch (e) {
      text("gr-error", e && e.message ? e.message : String(e));
      return;
    }
  }
  $("gr-none").hidden = list.length > 0;
  const body = $("grants");
  body.replaceChildren();
  for (const g of list) {
    const tr = document.createElement("tr");
    tr.dataset.grant = String(g.id);
    const what = g.kind === "prefix" ? "targets under a prefix, for the session of " : "this same call";
    const revoke = document.createElement("button");
    revoke.type = "button";
    revoke.className = "revoke";
    revoke.textContent = "Revoke";
    revoke.addEventListener("click", async () => {
      try {
        await loadGrants(await api.revokeGrant(g.id));
      } catch (e) {
        text("gr-error", e && e.message ? e.message : String(e));
      }
    });
    const cell = plainNode("td", `#${g.id} `);
    cell.append(revoke);
    tr.append(
      cell,
      covers(what, g),
      shownNode("td", g.tool),
      shownNode("td", g.server),
      shownNode("td", g.scope),
      shownNode("td", g.summary),
      plainNode("td", when(g.granted_at_ms)),
      plainNode("td", when(g.expires_at_ms)),
      plainNode("td", String(g.uses)),
    );
    body.append(tr);
  }
}

/** Wires the controls. `context`: { selected(), typed(), canApprove(), onTooSoon(ms), showError(e) }. */
export function start(context) {
  ctx = context;
  $("widen-kind").addEventListener("change", renderKind);
  $("approve-widen").addEventListener("click", onApproveWiden);
  renderOffer();
}
