// A request's preview: what the call would do, as the desk found it while the request waits (a
// file beside its new content, an upstream's dry run, a move, a directory, rows per table of SQL
// rehearsed and rolled back). Every string in it came from an upstream, arrives escaped and
// flagged by the desk (a Shown), and goes on screen as textContent, never as HTML. A preview that
// could not be made says so with its code; none at all says that too.
import { plainNode, shownNode } from "./shown.js";

const SIGNS = { same: ["", ""], changed: ["−", "+"], removed: ["−", ""], added: ["", "+"] };

function cell(className, content) {
  const td = document.createElement("td");
  td.className = className;
  td.textContent = content;
  return td;
}

/** One row of a side-by-side line diff (a DiffRow from the desk): the line numbers, the signs
 *  (in cells of the classes `signClasses`) and the two lines, each already escaped and flagged. */
export function diffRowNode(row, signClasses = ["sign", "sign"]) {
  const tr = document.createElement("tr");
  tr.className = "row-" + row.kind;
  tr.dataset.kind = row.kind;
  const [minus, plus] = SIGNS[row.kind] || ["", ""];
  const before = shownNode("td", row.before);
  before.className = "before";
  const after = shownNode("td", row.after);
  after.className = "after";
  tr.append(
    cell("no", row.before_line ?? ""), cell(signClasses[0], minus), before,
    cell("no", row.after_line ?? ""), cell(signClasses[1], plus), after,
  );
  return tr;
}

function sentence(...parts) {
  const p = document.createElement("p");
  p.className = "preview-line";
  for (const part of parts) p.append(typeof part === "string" ? part : part);
  return p;
}

function more(n, what) {
  return n > 0 ? [plainNode("p", `… ${n} more ${what}`, "preview-more")] : [];
}

function fileRows(rows) {
  const table = document.createElement("table");
  table.className = "diff preview-diff";
  const cols = document.createElement("colgroup");
  for (const c of ["no", "sign", "text", "no", "sign", "text"]) {
    const col = document.createElement("col");
    col.className = c;
    cols.append(col);
  }
  table.append(cols);
  const head = document.createElement("tr");
  for (const [label, span] of [["Now", 3], ["After approval", 3]]) {
    const th = document.createElement("th");
    th.colSpan = span;
    th.textContent = label;
    head.append(th);
  }
  const body = rows.map((row) => diffRowNode(row));
  table.append(head, ...body);
  return table;
}

function rowsTable(tables) {
  const table = document.createElement("table");
  table.className = "preview-rows";
  const head = document.createElement("tr");
  for (const label of ["Table", "Rows now", "After", "Gained", "Lost", "Changed"]) {
    head.append(plainNode("th", label));
  }
  table.append(head);
  for (const t of tables) {
    const tr = document.createElement("tr");
    tr.dataset.table = t.table.text;
    tr.append(shownNode("td", t.table));
    for (const n of [t.before, t.after, t.gained, t.lost]) tr.append(plainNode("td", String(n)));
    tr.append(plainNode("td", t.counted_only ? "not compared" : String(t.changed)));
    table.append(tr);
  }
  return table;
}

/** The nodes showing `p` (a PreviewView, or null when the desk has none for this call). */
export function previewNodes(p) {
  if (!p) return [plainNode("p", "No preview for this tool.", "preview-none")];
  switch (p.kind) {
    case "unavailable":
      return [
        plainNode("p", `Preview unavailable: ${p.reason}`, "preview-unavailable"),
        shownNode("p", p.detail),
      ];
    case "file": {
      const what = p.existed
        ? sentence("The file ", shownNode("code", p.path), " as it is now and as it would be:")
        : sentence("The file ", shownNode("code", p.path), " could not be read now (new?); the read tool said: ", shownNode("span", p.note));
      if (p.unchanged) return [what, plainNode("p", "No line would change.", "preview-line")];
      return [what, fileRows(p.rows), ...more(p.more, "lines")];
    }
    case "dry_run": {
      const pre = document.createElement("pre");
      pre.className = "preview-dry-run";
      for (const line of p.lines) pre.append(shownNode("span", line), "\n");
      return [sentence("The upstream's own dry run of this edit to ", shownNode("code", p.path), ":"), pre, ...more(p.more, "lines")];
    }
    case "move":
      return [
        sentence("Moves ", shownNode("code", p.source), " to ", shownNode("code", p.destination), "."),
        plainNode("p", p.destination_exists ? "Something exists at the destination now." : "Nothing exists at the destination now.", "preview-line"),
      ];
    case "directory":
      return [sentence(p.exists ? "Something exists at " : "Nothing exists yet at ", shownNode("code", p.path), ".")];
    case "rows":
      return [
        plainNode("p", "Rehearsed in a transaction that was rolled back: nothing was kept.", "preview-line"),
        rowsTable(p.tables),
      ];
    default:
      return [plainNode("p", "Preview unavailable: this window cannot show it", "preview-unavailable")];
  }
}
