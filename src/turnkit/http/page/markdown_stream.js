// The model's text as Markdown while it streams: each frame draws again only the blocks
// that can still change.
//
// A block has ended once every line it looked at to know where it stops is a whole line
// (a line break follows it): text that arrives later only adds to the last line and adds
// lines, and markdown.js reads each block from where the one before it ended, looking
// forward only. So an ended block draws the same whatever follows, and the next block
// starts where it stopped: such blocks are drawn once and then left alone (their nodes stay,
// and with them a selection, a screen reader's place, a focused or scrolled code block).
// The rest, from the first block still open, is drawn again from its text and patched into
// the nodes already there, so an open paragraph or code block keeps its node too. What is
// on the page always equals `renderMarkdown` of the whole text so far.

import { LOOKAHEAD, renderLines, splitLines } from "./markdown.js";

// container → { done: the text of the blocks kept, kept: their node count, text: drawn }
const drawn = new WeakMap();

/** Draw `text` as Markdown in `container` (which holds nothing else). */
export function drawMarkdown(container, text) {
  const state = drawn.get(container);
  if (state?.text === text) return;
  try {
    draw(container, text, state);
  } catch {
    container.textContent = text; // text the renderer cannot draw still shows, as written
    drawn.set(container, { done: "", kept: 0, text, broken: true }); // drawn again in full
  }
}

function draw(container, text, state) {
  // Only a text that grew keeps blocks: a kept block also looked at the line after it,
  // which a text that merely starts with the kept blocks may have changed.
  if (!state || state.broken || !text.startsWith(state.text) || container.childNodes.length < state.kept) {
    state = { done: "", kept: 0, text: null }; // a new text, or not a continuation: all again
    container.replaceChildren();
  }
  const rest = text.slice(state.done.length);
  const lines = splitLines(rest);
  const { fragment, ends } = renderLines(lines);
  // Whole lines are all but the last (it may still grow, or be followed by more).
  const whole = lines.length - 1;
  let ended = 0;
  while (ended < ends.length && ends[ended] + LOOKAHEAD < whole) ended += 1;
  patchChildren(container, state.kept, [...fragment.childNodes]);
  if (ended > 0) {
    state.done += rest.slice(0, lineStart(rest, ends[ended - 1]));
    state.kept += ended;
  }
  state.text = text;
  drawn.set(container, state);
}

/** Where line `n` of `text` starts (a line ends at `\r\n`, `\r` or `\n`, as in splitLines). */
function lineStart(text, n) {
  const breaks = /\r\n?|\n/g;
  for (let k = 0; k < n; k += 1) if (!breaks.exec(text)) return text.length;
  return breaks.lastIndex;
}

/** Make `parent`'s children from index `from` on look like `wanted`, keeping what agrees. */
function patchChildren(parent, from, wanted) {
  let have = parent.childNodes[from] ?? null;
  for (const want of wanted) {
    if (have) {
      const next = have.nextSibling;
      patch(have, want);
      have = next;
    } else parent.append(want);
  }
  while (have) {
    const next = have.nextSibling;
    have.remove();
    have = next;
  }
}

/**
 * `have` made equal to `want` (a node markdown.js just built): the same node when the tag
 * is the same, with its attributes and children brought in line; else `want` in its place.
 * Only what markdown.js built is copied: attributes it set, and text as text.
 */
function patch(have, want) {
  if (have.nodeName !== want.nodeName) {
    have.replaceWith(want);
  } else if (have.nodeType === Node.TEXT_NODE) {
    // Text that grew is added to, so a selection in it stays where it is.
    if (want.data.startsWith(have.data)) {
      if (want.data.length > have.data.length) have.appendData(want.data.slice(have.data.length));
    } else have.data = want.data;
  } else {
    for (const { name } of [...have.attributes]) if (!want.hasAttribute(name)) have.removeAttribute(name);
    for (const { name, value } of want.attributes) if (have.getAttribute(name) !== value) have.setAttribute(name, value);
    patchChildren(have, 0, [...want.childNodes]);
  }
}
