// Tiny DOM helpers: the dashboard builds its views with `h(...)` instead of a framework.

/**
 * Create an element. `props` keys: `class`, `text`, `dataset`, `style` (object), `onX` event
 * handlers, anything else becomes an attribute (`false`/`null`/`undefined` leave it out).
 * Children may be nodes, strings, numbers, arrays, or null/false (skipped).
 */
export function h(tag, props = {}, ...children) {
  const el = tag.includes(":")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.split(":")[1])
    : document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class")
      el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "text") el.textContent = String(value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else if (key.startsWith("on") && typeof value === "function")
      el.addEventListener(key.slice(2).toLowerCase(), value);
    else if (key === "value" && "value" in el) el.value = value;
    else if (key === "checked" && "checked" in el) el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/** An SVG element: `svg("path", {d: ...})`. */
export function svg(tag, props = {}, ...children) {
  return h(`svg:${tag}`, props, ...children);
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Replace every child of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}
