// Markdown for the model's text, built as DOM nodes: never parsed as HTML, so a model
// (or a prompt injected into it) cannot put markup or script on the page. What a chat
// answer uses: paragraphs, headings, lists, quotes, fenced code, tables, rules, and inline
// code, bold, italic, strike-through and links (http, https and mailto only).
// Text still streaming renders as it stands: an open code fence runs to the end.
//
// It runs on every frame an answer streams (on the blocks still open: markdown_stream.js),
// on text a model wrote: every pattern is linear in its line (no nested quantifiers),
// inline patterns are searched once per paragraph, and nesting deeper than MAX_DEPTH is
// drawn as text.
//
// Blocks are read top to bottom, each from the line the one before it ended at, looking
// only forward (at most one line past its own last, see LOOKAHEAD): what a block is never
// depends on the lines before it. markdown_stream.js relies on this to keep blocks that
// ended.

const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*))?$/;
const QUOTE = /^ {0,3}>[ \t]?/;
const ITEM = /^([ \t]*)([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
const DIVIDER_CELL = /^:?-+:?$/;
const SAFE_LINK = /^(https?:\/\/|mailto:)/i;
const MAX_DEPTH = 16;
const MAX_LINE = 10_000; // longer lines are not looked at as block syntax (a paragraph)

/**
 * How far past its last line a block may look to know it ended: a paragraph, quote or
 * table reads the line after it, a list the line after a blank one.
 */
export const LOOKAHEAD = 1;

/** The text as a fragment of DOM nodes. */
export function renderMarkdown(text) {
  return renderLines(splitLines(text)).fragment;
}

/** The text's lines, whichever line breaks it uses. */
export function splitLines(text) {
  return text.replace(/\r\n?/g, "\n").split("\n");
}

/**
 * Lines as blocks: a fragment with one node per block, and for each block the index of
 * the line after it (where the next block's search starts).
 */
export function renderLines(lines) {
  const fragment = document.createDocumentFragment();
  const ends = [];
  appendBlocks(fragment, lines, 0, ends);
  return { fragment, ends };
}

function appendBlocks(parent, lines, depth, ends = null) {
  if (depth > MAX_DEPTH) {
    parent.append(element("p", lines.join("\n"))); // as written: nothing deeper is parsed
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const block = line.length <= MAX_LINE ? kind(line) : null;
    if (block === "fence") {
      const fence = FENCE.exec(line);
      const close = new RegExp(`^ {0,3}${fence[1][0]}{${fence[1].length},}[ \\t]*$`);
      let end = i + 1;
      while (end < lines.length && !close.test(lines[end])) end += 1;
      const code = element("code", lines.slice(i + 1, end).join("\n"));
      if (fence[2]) code.className = `language-${fence[2]}`;
      parent.append(scroller(element("pre", code), "Code"));
      i = end + 1;
    } else if (block === "heading") {
      const [, marks, rest = ""] = HEADING.exec(line);
      // One level under the turn's own heading (h2): `#` is h3, `##` h4, down to h6.
      parent.append(auto(inline(`h${Math.min(6, marks.length + 2)}`, headingText(rest), depth)));
      i += 1;
    } else if (block === "rule") {
      parent.append(document.createElement("hr"));
      i += 1;
    } else if (block === "quote") {
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) quoted.push(lines[i++].replace(QUOTE, ""));
      const quote = auto(document.createElement("blockquote"));
      appendBlocks(quote, quoted, depth + 1);
      parent.append(quote);
    } else if (block === "item") {
      i = appendList(parent, lines, i, depth);
    } else if (line.includes("|") && isDivider(lines[i + 1] ?? "")) {
      i = appendTable(parent, lines, i, depth);
    } else {
      const paragraph = [];
      do paragraph.push(lines[i++].trim());
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i]));
      parent.append(auto(inline("p", paragraph.join("\n"), depth)));
    }
    ends?.push(i);
  }
}

/** Which block a line opens: fence, heading, rule, quote, item, or null (text). */
function kind(line) {
  if (FENCE.test(line)) return "fence";
  if (HEADING.test(line)) return "heading";
  if (isRule(line)) return "rule";
  if (QUOTE.test(line)) return "quote";
  if (ITEM.test(line)) return "item";
  return null;
}

function startsBlock(line) {
  return line.length <= MAX_LINE && kind(line) !== null;
}

/** `---`, `***` or `___` (three or more, spaces between allowed), indented at most 3. */
function isRule(line) {
  if (leading(line) > 3) return false;
  const marks = line.replace(/[ \t]/g, "");
  return marks.length >= 3 && /^[-*_]$/.test(marks[0]) && marks === marks[0].repeat(marks.length);
}

/** A heading's text without its closing `#`s. */
function headingText(rest) {
  const text = rest.trimEnd();
  let end = text.length;
  while (end > 0 && text[end - 1] === "#") end -= 1;
  return end === 0 || text[end - 1] === " " || text[end - 1] === "\t" ? text.slice(0, end).trimEnd() : text;
}

/** The list starting at line `i` (an item's deeper lines are its own blocks); the next line. */
function appendList(parent, lines, i, depth) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = document.createElement(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const item = lines[i].length <= MAX_LINE ? ITEM.exec(lines[i]) : null;
    if (!item || item[1].length !== indent || /\d/.test(item[2]) !== ordered) break;
    const own = [item[3]];
    i += 1;
    while (i < lines.length) {
      const line = lines[i];
      const deeper = line.trim() ? leading(line) > indent : leading(lines[i + 1] ?? "") > indent;
      if (!deeper && (!line.trim() || startsBlock(line))) break;
      own.push(deeper ? line : line.trim()); // a line not indented continues the item's text
      i += 1;
    }
    const li = auto(document.createElement("li"));
    appendBlocks(li, dedent(own), depth + 1);
    list.append(li);
    const sibling = ITEM.exec(lines[i + 1] ?? "");
    if (!lines[i]?.trim() && sibling && sibling[1].length === indent) i += 1; // a loose list
  }
  parent.append(list);
  return i;
}

function leading(line) {
  return line.length - line.trimStart().length;
}

/** An item's lines with the indentation its nested lines share taken off. */
function dedent(own) {
  let cut = Infinity;
  for (const line of own.slice(1)) if (line.trim() && leading(line)) cut = Math.min(cut, leading(line));
  if (cut === Infinity) return own;
  return own.map((line) => line.slice(Math.min(leading(line), cut)));
}

/** A table's divider row: `|---|:--:|`, cells of dashes with optional colons. */
function isDivider(line) {
  return line.length <= MAX_LINE && line.includes("|") && cells(line).every((cell) => DIVIDER_CELL.test(cell));
}

function appendTable(parent, lines, i, depth) {
  const aligns = cells(lines[i + 1]).map((cell) =>
    cell.endsWith(":") ? (cell.startsWith(":") ? "center" : "right") : cell.startsWith(":") ? "left" : "",
  );
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  cells(lines[i]).forEach((cell, k) => head.append(aligned(auto(inline("th", cell, depth)), aligns[k])));
  const body = table.createTBody();
  i += 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
    const row = body.insertRow();
    cells(lines[i]).forEach((cell, k) => row.append(aligned(auto(inline("td", cell, depth)), aligns[k])));
    i += 1;
  }
  const wrapper = scroller(element("div", table), "Table");
  wrapper.className = "table";
  parent.append(wrapper);
  return i;
}

/** A table row's cells (`\|` is a pipe inside a cell). */
function cells(line) {
  const found = [""];
  const text = line.trim();
  for (let k = 0; k < text.length; k += 1) {
    if (text[k] === "\\" && text[k + 1] === "|") {
      found[found.length - 1] += "|";
      k += 1;
    } else if (text[k] === "|") found.push("");
    else found[found.length - 1] += text[k];
  }
  if (text.startsWith("|")) found.shift();
  if (text.endsWith("|") && !text.endsWith("\\|")) found.pop();
  return found.map((cell) => cell.trim());
}

// A class, not a style attribute: the page's Content-Security-Policy refuses inline styles
// (markdown_stream.js copies attributes when it patches a cell whose alignment changed).
function aligned(cell, align) {
  if (align) cell.className = `align-${align}`;
  return cell;
}

// ── inline ────────────────────────────────────────────────────────────────────────

const INLINE = [
  [/`([^`\n]+)`/g, (m) => element("code", m[1])],
  [/\*\*(?=\S)([\s\S]*?\S)\*\*/g, (m, depth) => inline("strong", m[1], depth + 1)],
  [/__(?=\S)([\s\S]*?\S)__(?!\w)/g, (m, depth) => inline("strong", m[1], depth + 1)],
  [/~~(?=\S)([\s\S]*?\S)~~/g, (m, depth) => inline("del", m[1], depth + 1)],
  [/\*(?=[^\s*])([\s\S]*?[^\s*])\*/g, (m, depth) => inline("em", m[1], depth + 1)],
  [/(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/g, (m, depth) => inline("em", m[1], depth + 1)],
  [/\[([^\]\n]{1,500})\]\([ \t]*<?([^\s)>]{1,2000})>?(?:[ \t]+"[^"\n]{0,500}")?[ \t]*\)/g, link],
  [/<((?:https?:\/\/|mailto:)[^\s>]{1,2000})>/g, (m, depth) => link([m[0], m[1], m[1]], depth)],
  [/\\([\\`*_{}[\]()#+\-.!|~>])/g, (m) => document.createTextNode(m[1])],
];

/** An element of `tag` holding `text` with its inline markup. */
function inline(tag, text, depth) {
  const node = document.createElement(tag);
  if (depth > MAX_DEPTH) node.append(text);
  else appendInline(node, text, depth);
  return node;
}

/**
 * `text` with its inline markup, left to right. Each pattern is searched again only once
 * the text passed its last match (its next match cannot come earlier), so a paragraph costs
 * one search per pattern and match, not one per pattern per match.
 */
function appendInline(parent, text, depth) {
  const next = INLINE.map(() => undefined); // each pattern's next match: a match, or null
  let at = 0;
  while (at < text.length) {
    let best = -1;
    for (let k = 0; k < INLINE.length; k += 1) {
      if (next[k] === undefined || (next[k] !== null && next[k].index < at)) {
        const pattern = INLINE[k][0];
        pattern.lastIndex = at;
        next[k] = pattern.exec(text);
      }
      if (next[k] && (best < 0 || next[k].index < next[best].index)) best = k;
    }
    if (best < 0) break;
    const match = next[best];
    if (match.index > at) parent.append(text.slice(at, match.index));
    parent.append(INLINE[best][1](match, depth));
    at = match.index + match[0].length;
  }
  if (at < text.length) parent.append(text.slice(at));
}

function link(match, depth) {
  const [source, label, href] = match;
  if (!SAFE_LINK.test(href)) return document.createTextNode(source);
  const anchor = inline("a", label, depth + 1);
  anchor.href = href;
  anchor.target = "_blank";
  anchor.rel = "noopener noreferrer nofollow";
  anchor.append(newTabNote());
  return anchor;
}

/** Said after a link's text: the link opens in a new tab. */
export function newTabNote() {
  const note = element("span", " (opens in a new tab)");
  note.className = "visually-hidden";
  return note;
}

/** A box that scrolls sideways: a keyboard reaches it (Tab, then the arrow keys). */
export function scroller(node, name) {
  node.tabIndex = 0;
  node.setAttribute("role", "region");
  node.setAttribute("aria-label", name);
  return node;
}

/** Each block takes its direction from its own text (Arabic or Hebrew reads right to left). */
function auto(node) {
  node.dir = "auto";
  return node;
}

function element(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}
