// Reading a pydantic JSON schema: resolve `$ref`s, classify each property into the kind of input
// that edits it, and check a value against it the way the server will (type, range, enum,
// pattern, required), so most mistakes are named before a request is sent.

/** A copy of `schema` with every `{"$ref": "#/$defs/X"}` replaced by X (sibling keys kept). */
export function resolveRefs(schema, root = schema, stack = []) {
  if (Array.isArray(schema)) return schema.map((item) => resolveRefs(item, root, stack));
  if (!schema || typeof schema !== "object") return schema;
  if (typeof schema.$ref === "string") {
    const ref = schema.$ref;
    if (stack.includes(ref)) return {}; // a recursive schema: edit that level as raw JSON
    const target = ref
      .replace(/^#\//, "")
      .split("/")
      .reduce((node, key) => node?.[key.replace(/~1/g, "/").replace(/~0/g, "~")], root);
    if (!target) throw new Error(`unresolvable $ref ${ref}`);
    const { $ref, ...siblings } = schema;
    return { ...resolveRefs(target, root, [...stack, ref]), ...resolveRefs(siblings, root, stack) };
  }
  const out = {};
  for (const [key, value] of Object.entries(schema)) {
    if (key !== "$defs" && key !== "definitions") out[key] = resolveRefs(value, root, stack);
  }
  return out;
}

const isStringArray = (s) => s.type === "array" && s.items?.type === "string";
const isStringKeyword = (s) => s.type === "string" && (s.const !== undefined || Array.isArray(s.enum));

/**
 * What input edits this property. Returns `{kind, nullable, schema, ...}` with kind one of
 * const, enum, boolean, integer, number, string, tuple, list, list-or-keyword, object, dict, json.
 */
export function classify(property) {
  let schema = property;
  let nullable = false;
  const variants = property.anyOf || property.oneOf;
  if (variants) {
    const concrete = variants.filter((v) => v.type !== "null");
    nullable = concrete.length < variants.length;
    const { anyOf, oneOf, ...outer } = property;
    if (concrete.length === 1) {
      // Title, default and description live on the outer schema; constraints on the member.
      schema = { ...concrete[0], ...outer };
    } else if (concrete.length === 2 && concrete.some(isStringArray) && concrete.some(isStringKeyword)) {
      const keyword = concrete.find(isStringKeyword);
      return { kind: "list-or-keyword", nullable, schema: outer, keywords: keyword.enum || [keyword.const] };
    } else {
      return { kind: "json", nullable, schema: outer };
    }
  }
  const base = { nullable, schema };
  if (schema.const !== undefined) return { ...base, kind: "const" };
  if (Array.isArray(schema.enum)) return { ...base, kind: "enum" };
  switch (schema.type) {
    case "boolean":
    case "integer":
    case "number":
    case "string":
      return { ...base, kind: schema.type };
    case "array":
      if (
        Array.isArray(schema.prefixItems) &&
        schema.prefixItems.every((i) => ["number", "integer"].includes(i.type))
      ) {
        return { ...base, kind: "tuple" };
      }
      return isStringArray(schema) ? { ...base, kind: "list" } : { ...base, kind: "json" };
    case "object":
      return schema.properties ? { ...base, kind: "object" } : { ...base, kind: "dict" };
    default:
      return { ...base, kind: "json" };
  }
}

function formatBound(value) {
  return Number.isInteger(value) ? value.toLocaleString("en-US") : String(value);
}

/** "≥ 8", "> 0 and < 10", … for hints; "" when the schema sets no bounds. */
export function describeRange(schema) {
  const parts = [];
  if (schema.minimum !== undefined) parts.push(`≥ ${formatBound(schema.minimum)}`);
  if (schema.exclusiveMinimum !== undefined) parts.push(`> ${formatBound(schema.exclusiveMinimum)}`);
  if (schema.maximum !== undefined) parts.push(`≤ ${formatBound(schema.maximum)}`);
  if (schema.exclusiveMaximum !== undefined) parts.push(`< ${formatBound(schema.exclusiveMaximum)}`);
  return parts.join(" and ");
}

/** The error message for a number against its bounds, or null when it is within them. */
export function checkRange(value, schema) {
  if (schema.minimum !== undefined && value < schema.minimum) {
    return `must be greater than or equal to ${formatBound(schema.minimum)}`;
  }
  if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum) {
    return `must be greater than ${formatBound(schema.exclusiveMinimum)}`;
  }
  if (schema.maximum !== undefined && value > schema.maximum) {
    return `must be less than or equal to ${formatBound(schema.maximum)}`;
  }
  if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum) {
    return `must be less than ${formatBound(schema.exclusiveMaximum)}`;
  }
  return null;
}

// Python and JavaScript regexes differ at the edges: a pattern JS cannot compile is left to the
// server to check rather than blocking the form.
function compilePattern(pattern) {
  try {
    return new RegExp(pattern, "u");
  } catch {
    return null;
  }
}

/**
 * Parse the text of an input as the schema's type. Returns `{value}` or `{error}`; an empty text
 * gives `{empty: true}` so the caller decides between null, the default and "required".
 */
export function parseInput(text, kind, schema) {
  const raw = typeof text === "string" ? text.trim() : text;
  if (raw === "" || raw === undefined || raw === null) return { empty: true };
  let value;
  switch (kind) {
    case "integer":
      if (!/^[-+]?\d+$/.test(raw)) return { error: "must be a whole number" };
      value = Number(raw);
      break;
    case "number":
      value = Number(raw);
      if (!Number.isFinite(value)) return { error: "must be a number" };
      break;
    case "enum":
      if (!schema.enum.map(String).includes(raw))
        return { error: `must be one of ${schema.enum.join(", ")}` };
      value = schema.enum.find((option) => String(option) === raw);
      break;
    case "string":
      value = raw;
      if (schema.minLength !== undefined && value.length < schema.minLength) {
        return { error: `must have at least ${schema.minLength} characters` };
      }
      if (schema.maxLength !== undefined && value.length > schema.maxLength) {
        return { error: `must have at most ${schema.maxLength} characters` };
      }
      if (schema.pattern && compilePattern(schema.pattern)?.test(value) === false) {
        return { error: `must match the pattern ${schema.pattern}` };
      }
      return { value };
    case "dict":
    case "json":
      try {
        value = JSON.parse(raw);
      } catch (err) {
        return { error: `is not valid JSON (${err.message})` };
      }
      if (kind === "dict" && (typeof value !== "object" || value === null || Array.isArray(value))) {
        return { error: 'must be a JSON object, e.g. {"key": 1}' };
      }
      return { value };
    default:
      return { value: raw };
  }
  const rangeError = checkRange(value, schema);
  return rangeError ? { error: rangeError } : { value };
}

/** Structural equality of JSON values (for "is this still the default?"). */
export function sameJson(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** "max_length" → "Max length"; short ML abbreviations keep their usual spelling. */
export function humanize(key) {
  const words = {
    lr: "LR",
    lora: "LoRA",
    fsdp: "FSDP",
    ddp: "DDP",
    id: "ID",
    cls: "class",
    dp: "DP",
    eps: "epsilon",
  };
  const text = key
    .split("_")
    .map((word) => words[word.toLowerCase()] || word)
    .join(" ");
  return text.charAt(0).toUpperCase() + text.slice(1);
}
