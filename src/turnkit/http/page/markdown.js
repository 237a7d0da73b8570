// Markdown for the model's text, built as DOM nodes: never parsed as HTML, so a model
// (or a prompt injected into it) cannot put markup or script on the page. What a chat
// answer uses: paragraphs, headings, lists, quotes, fenced code, tables, rules, and inline
// code, bold, italic, strike-through and links (http, https and mailto only).
// Text still streaming renders as it stands: an open code fence runs to the end.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_DIVIDER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_LINK = /^(https?:\/\/|mailto:)/i;

/** The text as a fragment of DOM nodes. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  appendBlocks(fragment, text.replace(/\r\n?/g, "\n").split("\n"));
  return fragment;
}

function appendBlocks(parent, lines) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      const close = new RegExp(`^ {0,3}${fence[1][0]}{${fence[1].length},}\\s*$`);
      let end = i + 1;
      while (end < lines.length && !close.test(lines[end])) end += 1;
      const code = element("code", lines.slice(i + 1, end).join("\n"));
      if (fence[2]) code.className = `language-${fence[2]}`;
      parent.append(element("pre", code));
      i = end + 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      parent.append(inline(`h${heading[1].length}`, heading[2]));
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(document.createElement("hr"));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) quoted.push(lines[i++].replace(QUOTE, ""));
      const quote = document.createElement("blockquote");
      appendBlocks(quote, quoted);
      parent.append(quote);
      continue;
    }
    if (ITEM.test(line)) {
      i = appendList(parent, lines, i);
      continue;
    }
    if (line.includes("|") && lines[i + 1]?.includes("|") && TABLE_DIVIDER.test(lines[i + 1])) {
      i = appendTable(parent, lines, i);
      continue;
    }
    const paragraph = [];
    while (i < lines.length && lines[i].trim() && !startsBlock(lines, i)) paragraph.push(lines[i++].trim());
    parent.append(inline("p", paragraph.join("\n")));
  }
}

function startsBlock(lines, i) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

/** The list starting at line `i` (an item's deeper lines are its own blocks); the next line. */
function appendList(parent, lines, i) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = document.createElement(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const item = ITEM.exec(lines[i]);
    if (!item || item[1].length !== indent || /\d/.test(item[2]) !== ordered) break;
    const own = [item[3]];
    i += 1;
    while (i < lines.length) {
      const line = lines[i];
      const deeper = line.trim() ? leading(line) > indent : leading(lines[i + 1] ?? "") > indent;
      if (!deeper && (!line.trim() || startsBlock(lines, i))) break;
      own.push(deeper ? line : line.trim()); // a line not indented continues the item's text
      i += 1;
    }
    const li = document.createElement("li");
    appendBlocks(li, dedent(own));
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
  const indents = own.slice(1).filter((line) => line.trim() && leading(line)).map(leading);
  const cut = indents.length ? Math.min(...indents) : 0;
  return own.map((line) => line.slice(Math.min(leading(line), cut)));
}

function appendTable(parent, lines, i) {
  const aligns = cells(lines[i + 1]).map((cell) =>
    cell.endsWith(":") ? (cell.startsWith(":") ? "center" : "right") : cell.startsWith(":") ? "left" : "",
  );
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  cells(lines[i]).forEach((cell, k) => head.append(aligned(inline("th", cell), aligns[k])));
  const body = table.createTBody();
  i += 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
    const row = body.insertRow();
    cells(lines[i]).forEach((cell, k) => row.append(aligned(inline("td", cell), aligns[k])));
    i += 1;
  }
  const scroller = element("div", table);
  scroller.className = "table";
  parent.append(scroller);
  return i;
}

function cells(line) {
  return line
    .trim()
    .replace(/^\|/, "")
    .replace(/(?<!\\)\|$/, "")
    .split(/(?<!\\)\|/)
    .map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function aligned(cell, align) {
  if (align) cell.style.textAlign = align;
  return cell;
}

// ── inline ────────────────────────────────────────────────────────────────────────

const INLINE = [
  [/`([^`]+)`/, (m) => element("code", m[1])],
  [/\*\*(?=\S)([\s\S]*?\S)\*\*/, (m) => inline("strong", m[1])],
  [/__(?=\S)([\s\S]*?\S)__(?!\w)/, (m) => inline("strong", m[1])],
  [/~~(?=\S)([\s\S]*?\S)~~/, (m) => inline("del", m[1])],
  [/\*(?=[^\s*])([\s\S]*?[^\s*])\*/, (m) => inline("em", m[1])],
  [/(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/, (m) => inline("em", m[1])],
  [/\[([^\]]+)\]\(\s*<?([^\s)>]+)>?(?:\s+"[^"]*")?\s*\)/, link],
  [/<((?:https?:\/\/|mailto:)[^\s>]+)>/, (m) => link([m[0], m[1], m[1]])],
  [/\\([\\`*_{}[\]()#+\-.!|~>])/, (m) => document.createTextNode(m[1])],
];

/** An element of `tag` holding `text` with its inline markup. */
function inline(tag, text) {
  const node = document.createElement(tag);
  appendInline(node, text);
  return node;
}

function appendInline(parent, text) {
  while (text) {
    let best = null;
    for (const [pattern, build] of INLINE) {
      const match = pattern.exec(text);
      if (match && (!best || match.index < best.match.index)) best = { match, build };
    }
    if (!best) {
      parent.append(text);
      return;
    }
    if (best.match.index) parent.append(text.slice(0, best.match.index));
    parent.append(best.build(best.match));
    text = text.slice(best.match.index + best.match[0].length);
  }
}

function link(match) {
  const [source, label, href] = match;
  if (!SAFE_LINK.test(href)) return document.createTextNode(source);
  const anchor = inline("a", label);
  anchor.href = href;
  anchor.target = "_blank";
  anchor.rel = "noopener noreferrer nofollow";
  return anchor;
}

function element(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}
