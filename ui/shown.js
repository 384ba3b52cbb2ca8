// Putting a Shown ({ text, flags }: a string from an agent, an upstream or a file one may have
// written, escaped and flagged by the desk) on screen: always as textContent, never as HTML.

export const FLAG_LABELS = {
  bidi: "contains direction-changing characters (shown escaped)",
  invisible: "contains invisible characters (shown escaped)",
  non_ascii: "contains non-ASCII characters that may look like others",
};

/** A Shown as an element `tag`: its text, and one small mark carrying its flags. */
export function shownNode(tag, value) {
  const node = document.createElement(tag);
  node.textContent = value ? value.text : "";
  if (value && value.flags.length) {
    const mark = document.createElement("span");
    mark.className = "flag mark";
    mark.dataset.flag = value.flags.join(" ");
    mark.title = value.flags.map((f) => FLAG_LABELS[f] || f).join("; ");
    mark.textContent = "⚠";
    node.append(" ", mark);
  }
  return node;
}

/** An element `tag` holding plain text of the window's own. */
export function plainNode(tag, text, className) {
  const node = document.createElement(tag);
  node.textContent = text;
  if (className) node.className = className;
  return node;
}
