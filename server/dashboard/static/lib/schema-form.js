// A form generated from a JSON schema. Every input is named by its dotted path
// (`spec.data.max_length`), the same path the API puts in an error's `param`, so a server-side
// 422 lands next to the field it is about. Values equal to the schema default are left out of
// the request: the server fills defaults itself and the stored job shows the resolved spec.

import { h, replace } from "./dom.js";
import { classify, describeRange, humanize, parseInput, resolveRefs, sameJson } from "./schema.js";

const OMIT = Symbol("omit"); // "leave this key out of the request"
let uid = 0;

// Free-form dictionaries and nested optional objects are rarely edited: they go under "Advanced".
const ADVANCED_KINDS = new Set(["dict", "json", "object"]);

/** An input for one leaf property. */
class Field {
  constructor({ key, path, property, required }) {
    this.key = key;
    this.path = path;
    this.required = required;
    Object.assign(this, classify(property));
    // pydantic leaves `default` out for a default_factory (`dict` fields): that default is {}.
    const dictFactory = this.kind === "dict" && !this.nullable ? {} : undefined;
    this.default = Object.hasOwn(this.schema, "default") ? this.schema.default : dictFactory;
    this.id = `field-${++uid}`;
    this.errorEl = h("p", { class: "field-error", id: `${this.id}-error`, role: "alert", hidden: true });
    this.input = this.buildInput();
    this.el = this.buildElement();
    this.write(this.default);
  }

  buildInput() {
    const s = this.schema;
    const common = { id: this.id, name: this.path, "aria-describedby": `${this.id}-hint ${this.id}-error` };
    switch (this.kind) {
      case "boolean":
        return h("input", { ...common, type: "checkbox", class: "switch" });
      case "enum":
        return h(
          "select",
          common,
          this.nullable ? h("option", { value: "" }, "none") : null,
          s.enum.map((option) => h("option", { value: String(option) }, String(option))),
        );
      case "integer":
      case "number":
        return h("input", {
          ...common,
          type: "number",
          inputmode: this.kind === "integer" ? "numeric" : "decimal",
          step: this.kind === "integer" ? "1" : "any",
          min: s.minimum,
          max: s.maximum,
          placeholder: this.nullable ? "none" : undefined,
        });
      case "tuple":
        this.parts = s.prefixItems.map((item, i) =>
          h("input", {
            type: "number",
            step: "any",
            name: `${this.path}.${i}`,
            "aria-label": `${humanize(this.key)} ${i + 1}`,
          }),
        );
        return h("div", { ...common, class: "tuple", role: "group" }, this.parts);
      case "dict":
      case "json":
        return h("textarea", {
          ...common,
          rows: 2,
          spellcheck: "false",
          class: "mono",
          placeholder: this.nullable ? "none" : "{}",
        });
      case "list":
      case "list-or-keyword":
        return h("input", {
          ...common,
          type: "text",
          placeholder: this.keywords ? `${this.keywords.join(" | ")} or a, b, c` : "a, b, c",
        });
      default:
        return h("input", {
          ...common,
          type: "text",
          autocomplete: "off",
          spellcheck: "false",
          placeholder: this.nullable ? "optional" : "",
        });
    }
  }

  buildElement() {
    const s = this.schema;
    const hint = [s.description, describeRange(s), s.pattern && `pattern ${s.pattern}`]
      .filter(Boolean)
      .join(" · ");
    const hintEl = h("p", { class: "hint", id: `${this.id}-hint` }, withCode(hint));
    const label = h(
      "label",
      { for: this.kind === "tuple" ? undefined : this.id },
      humanize(this.key),
      this.required ? h("span", { class: "required", "aria-hidden": "true" }, " *") : null,
      h("code", { class: "field-key" }, this.key),
    );
    if (this.required) this.input.setAttribute("aria-required", "true");
    const events = this.kind === "boolean" || this.kind === "enum" ? ["change"] : ["change", "blur"];
    for (const name of events) this.input.addEventListener(name, () => this.validate(), true);
    this.input.addEventListener("input", () => this.setError(null), true);
    const wide = ["dict", "json"].includes(this.kind);
    return h(
      "div",
      { class: ["field", `kind-${this.kind}`, wide && "wide"], dataset: { path: this.path } },
      this.kind === "boolean" ? h("div", { class: "check" }, this.input, label) : [label, this.input],
      hintEl,
      this.errorEl,
    );
  }

  write(value) {
    switch (this.kind) {
      case "boolean":
        this.input.checked = Boolean(value);
        break;
      case "tuple":
        this.parts.forEach((part, i) => (part.value = value?.[i] ?? ""));
        break;
      case "dict":
      case "json":
        this.input.value =
          value === null || value === undefined || (this.kind === "dict" && sameJson(value, {}))
            ? ""
            : JSON.stringify(value);
        break;
      case "list":
      case "list-or-keyword":
        this.input.value = Array.isArray(value) ? value.join(", ") : (value ?? "");
        break;
      default:
        this.input.value = value === null || value === undefined ? "" : String(value);
    }
    this.setError(null);
  }

  /** `{value}` (OMIT to leave the key out) or `{error}`; shows the error next to the input. */
  read() {
    const result = this.parse();
    this.setError(result.error || null);
    return result;
  }

  validate() {
    return !this.read().error;
  }

  parse() {
    if (this.kind === "const") return { value: this.schema.const };
    if (this.kind === "boolean") return this.result(this.input.checked);
    if (this.kind === "tuple") {
      const values = [];
      for (const [i, part] of this.parts.entries()) {
        const parsed = parseInput(part.value, this.schema.prefixItems[i].type, this.schema.prefixItems[i]);
        if (parsed.empty) return { error: `needs ${this.parts.length} numbers` };
        if (parsed.error) return { error: `item ${i + 1} ${parsed.error}` };
        values.push(parsed.value);
      }
      return this.result(values);
    }
    if (this.kind === "list" || this.kind === "list-or-keyword") {
      const text = this.input.value.trim();
      if (!text) return this.empty();
      if (this.keywords?.includes(text)) return this.result(text);
      return this.result(
        text
          .split(",")
          .map((item) => item.trim())
          .filter(Boolean),
      );
    }
    const parsed = parseInput(this.input.value, this.kind, this.schema);
    if (parsed.error) return parsed;
    if (parsed.empty) return this.empty();
    return this.result(parsed.value);
  }

  empty() {
    if (this.required) return { error: "is required" };
    if (this.kind === "dict" && !this.nullable) return this.result({});
    return this.nullable ? this.result(null) : { value: OMIT };
  }

  result(value) {
    return { value: !this.required && sameJson(value, this.default) ? OMIT : value };
  }

  setError(message) {
    this.errorEl.hidden = !message;
    this.errorEl.textContent = message ? `${humanize(this.key)} ${message}` : "";
    this.el.classList.toggle("invalid", Boolean(message));
    if (message) this.input.setAttribute("aria-invalid", "true");
    else this.input.removeAttribute("aria-invalid");
  }

  showMessage(message) {
    this.errorEl.hidden = false;
    this.errorEl.textContent = message;
    this.el.classList.add("invalid");
    this.input.setAttribute("aria-invalid", "true");
  }

  focus() {
    (this.parts?.[0] || this.input).focus();
  }
}

/** An object property: its own fields, and a switch when the whole object may be null. */
class Group {
  /** `mode`: "section" (a card), "nested" (a box inside a section) or "root" (no element). */
  constructor({ key, path, property, required, mode }) {
    this.key = key;
    this.path = path;
    this.required = required;
    Object.assign(this, classify(property));
    this.default = this.schema.default;
    this.children = [];
    const props = this.schema.properties || {};
    const requiredKeys = new Set(this.schema.required || []);
    for (const [childKey, childProperty] of Object.entries(props)) {
      this.children.push(
        makeNode({
          key: childKey,
          path: path ? `${path}.${childKey}` : childKey,
          property: childProperty,
          required: requiredKeys.has(childKey),
          mode: mode === "root" ? "section" : "nested",
        }),
      );
    }
    this.errorEl = h("p", { class: "field-error", role: "alert", hidden: true });
    if (mode === "root") {
      this.enabled = true;
      return;
    }
    this.el = mode === "section" ? this.buildSection() : this.buildNested();
    this.setEnabled(!this.nullable || (this.default !== null && this.default !== undefined));
  }

  visibleChildren() {
    return this.children.filter((child) => child.kind !== "const");
  }

  layout() {
    const visible = this.visibleChildren();
    const basic = visible.filter((child) => !ADVANCED_KINDS.has(child.kind));
    const advanced = visible.filter((child) => ADVANCED_KINDS.has(child.kind));
    this.body = h(
      "div",
      { class: "group-body" },
      h(
        "div",
        { class: "grid" },
        basic.map((child) => child.el),
      ),
      advanced.length
        ? (this.advanced = h(
            "details",
            { class: "advanced" },
            h("summary", {}, "Advanced"),
            h(
              "div",
              { class: "grid" },
              advanced.map((c) => c.el),
            ),
          ))
        : null,
    );
    return this.body;
  }

  toggle() {
    if (!this.nullable) return null;
    this.switch = h("input", {
      type: "checkbox",
      class: "switch",
      name: `${this.path}.__enabled`,
      id: `field-${++uid}`,
    });
    this.switch.addEventListener("change", () => this.setEnabled(this.switch.checked));
    return h(
      "div",
      { class: "check toggle" },
      this.switch,
      h("label", { for: this.switch.id }, `Use ${humanize(this.key).toLowerCase()}`),
    );
  }

  buildSection() {
    return h(
      "fieldset",
      { class: "section card", dataset: { path: this.path } },
      h("legend", {}, humanize(this.key)),
      this.schema.description ? h("p", { class: "section-doc" }, withCode(this.schema.description)) : null,
      this.toggle(),
      this.errorEl,
      this.layout(),
    );
  }

  buildNested() {
    return h(
      "fieldset",
      { class: "field nested wide", dataset: { path: this.path } },
      h("legend", {}, humanize(this.key), h("code", { class: "field-key" }, this.key)),
      this.schema.description ? h("p", { class: "hint" }, withCode(this.schema.description)) : null,
      this.toggle(),
      this.errorEl,
      this.layout(),
    );
  }

  setEnabled(enabled) {
    this.enabled = enabled;
    if (this.switch) this.switch.checked = enabled;
    this.body.hidden = !enabled;
  }

  write(value) {
    if (this.nullable) this.setEnabled(value !== null && value !== undefined);
    for (const child of this.children) child.write(valueOf(value, child));
  }

  read() {
    if (!this.enabled) return { value: this.default === null || this.default === undefined ? OMIT : null };
    const out = {};
    let error = null;
    for (const child of this.children) {
      const result = child.read();
      if (result.error) error = error || result.error;
      else if (result.value !== OMIT) out[child.key] = result.value;
    }
    if (error) return { error };
    // An optional object switched on is sent even when every field is at its default.
    const keep =
      this.required || this.nullable || Object.keys(out).some((key) => this.child(key).kind !== "const");
    return { value: keep ? out : OMIT };
  }

  child(key) {
    return this.children.find((c) => c.key === key);
  }

  setError() {
    this.errorEl.hidden = true;
  }

  showMessage(message) {
    this.errorEl.hidden = false;
    this.errorEl.textContent = message;
  }

  focus() {
    (this.switch || this.el.querySelector("input, select, textarea"))?.focus();
  }

  *walk() {
    yield this;
    for (const child of this.children) {
      if (child instanceof Group) yield* child.walk();
      else yield child;
    }
  }
}

// Docstrings quote code in backticks (`TransformersModel`): show those parts as code.
function withCode(text) {
  return String(text || "")
    .split("`")
    .map((part, i) => (i % 2 ? h("code", {}, part) : part));
}

// An explicit null in a stored spec is a value (e.g. "keep every checkpoint"), not "use the default".
function valueOf(object, child) {
  return object && Object.hasOwn(object, child.key) ? object[child.key] : child.default;
}

function makeNode(options) {
  return classify(options.property).kind === "object" ? new Group(options) : new Field(options);
}

/**
 * The whole submit form: job-level fields plus one section per top-level spec property.
 * `values()` returns `{body}` ready for POST /v1/jobs or `{error}` (already shown inline).
 */
export class SchemaForm {
  constructor({ jobFieldsSchema, specSchema }) {
    const spec = resolveRefs(specSchema);
    const jobFields = resolveRefs(jobFieldsSchema);
    this.job = new Group({
      key: "job",
      path: "",
      property: { ...jobFields, description: null },
      required: true,
      mode: "section",
    });
    // The spec's own properties (model, data, …) are the sections; the spec itself has no box.
    this.spec = new Group({ key: "spec", path: "spec", property: spec, required: true, mode: "root" });
    this.banner = h("div", { class: "form-banner", role: "alert", hidden: true });
    this.el = h(
      "div",
      { class: "schema-form" },
      this.banner,
      this.job.el,
      this.spec.children.map((section) => section.el),
    );
  }

  nodes() {
    return [...this.job.walk(), ...this.spec.walk()];
  }

  find(path) {
    return this.nodes().find((node) => node.path === path);
  }

  fill({ spec, ...job }) {
    for (const child of this.job.children) child.write(valueOf(job, child));
    this.spec.write(spec || {});
  }

  clearErrors() {
    this.banner.hidden = true;
    for (const node of this.nodes()) node.setError(null);
  }

  values() {
    this.clearErrors();
    const job = this.job.read();
    const spec = this.spec.read();
    if (job.error || spec.error) {
      this.focusFirstError();
      return { error: "fix the highlighted fields" };
    }
    return {
      body: { ...(job.value === OMIT ? {} : job.value), spec: spec.value === OMIT ? {} : spec.value },
    };
  }

  /** Show a server error at the field its `param` names, or the nearest enclosing section. */
  showServerError(param, message) {
    let path = param || "";
    while (path) {
      const node = this.find(path);
      if (node && node !== this.spec) {
        const enclosing = node.el.closest("details");
        if (enclosing) enclosing.open = true;
        // Open every switched-off optional object around the field, so the message can be seen.
        for (const group of this.nodes()) {
          if (group instanceof Group && group.nullable && !group.enabled && group.el.contains(node.el)) {
            group.setEnabled(true);
          }
        }
        node.showMessage(message);
        node.el.scrollIntoView({ block: "center" });
        node.focus();
        return node;
      }
      path = path.includes(".") ? path.slice(0, path.lastIndexOf(".")) : "";
    }
    replace(this.banner, message);
    this.banner.hidden = false;
    this.banner.scrollIntoView({ block: "center" });
    return null;
  }

  focusFirstError() {
    const invalid = this.el.querySelector(".field.invalid");
    if (!invalid) return;
    const enclosing = invalid.closest("details");
    if (enclosing) enclosing.open = true;
    invalid.scrollIntoView({ block: "center" });
    invalid.querySelector("input, select, textarea")?.focus();
  }
}
