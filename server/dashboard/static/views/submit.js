// The submit form, generated from the JobSpec JSON schema the server hands out. Client-side
// checks catch type/range/enum/required mistakes; whatever only the server can judge (paths
// outside the allowed roots, a batch size the ranks cannot split) comes back as a 422 whose
// `param` names the field, and is shown next to it.

import { ApiError, getJson, postJson } from "../lib/api.js";
import { h } from "../lib/dom.js";
import { SchemaForm } from "../lib/schema-form.js";
import { toast } from "../lib/ui.js";

export async function mount(root, { query, navigate }) {
  const [specSchema, jobFieldsSchema] = await Promise.all([
    getJson("/dashboard/api/jobspec-schema"),
    getJson("/dashboard/api/job-fields-schema"),
  ]);
  const form = new SchemaForm({ specSchema, jobFieldsSchema });
  const source = query.get("from");
  if (source) {
    const job = await getJson(`/v1/jobs/${encodeURIComponent(source)}`);
    form.fill({ ...job, name: job.name ? `${job.name}-copy` : null });
  }

  const submit = h("button", { type: "submit", class: "btn primary" }, "Submit job");
  const preview = h("pre", { class: "spec mono", hidden: true });
  const previewButton = h(
    "button",
    { type: "button", class: "btn ghost", "aria-expanded": "false" },
    "Show request JSON",
  );
  previewButton.addEventListener("click", () => {
    const result = form.values();
    const showing = preview.hidden && !result.error;
    preview.hidden = !showing;
    previewButton.setAttribute("aria-expanded", String(showing));
    previewButton.textContent = showing ? "Hide request JSON" : "Show request JSON";
    if (showing) preview.textContent = JSON.stringify(result.body, null, 2);
  });
  const element = h(
    "form",
    { class: "submit-form", novalidate: true, "aria-label": "New training job" },
    form.el,
    h(
      "div",
      { class: "form-actions card" },
      h("p", { class: "hint" }, "Fields left at their defaults are filled in by the server."),
      previewButton,
      submit,
    ),
    preview,
  );
  element.addEventListener("submit", async (event) => {
    event.preventDefault();
    const result = form.values();
    if (result.error) {
      toast(`Not submitted: ${result.error}`, "error");
      return;
    }
    submit.disabled = true;
    try {
      const job = await postJson("/v1/jobs", result.body);
      toast(`Submitted ${job.id}`, "success");
      navigate(`/jobs/${encodeURIComponent(job.id)}`);
    } catch (err) {
      if (err instanceof ApiError) form.showServerError(err.param, err.message);
      else throw err;
    } finally {
      submit.disabled = false;
    }
  });
  root.append(
    h(
      "section",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, source ? "Edit & resubmit" : "New training job")),
      h(
        "p",
        { class: "muted lead" },
        "Only the model and the training data are required; everything else starts at its default.",
      ),
      element,
    ),
  );
  return () => {};
}
