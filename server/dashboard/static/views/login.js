// Sign-in: the user pastes an API token; it is checked against the API before it is kept.

import { ApiError, getJson, setToken } from "../lib/api.js";
import { h } from "../lib/dom.js";

export async function mount(root, { query, navigate }) {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "current-password",
    required: true,
    placeholder: "tw-…",
    "aria-describedby": "token-help token-error",
  });
  const error = h("p", { class: "field-error", id: "token-error", role: "alert", hidden: true });
  const button = h("button", { type: "submit", class: "btn primary wide" }, "Sign in");
  const form = h(
    "form",
    { class: "card login-card", novalidate: true },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Fine-tune, watch and control training jobs."),
    h("div", { class: "field" }, h("label", { for: "token" }, "API token"), input, error),
    h(
      "p",
      { class: "hint", id: "token-help" },
      "Create one with ",
      h("code", {}, "twinkle-jobs tokens create --project NAME"),
      ". It is kept in this browser's local storage until you sign out.",
    ),
    button,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    error.hidden = true;
    if (!token) {
      error.textContent = "Enter an API token";
      error.hidden = false;
      input.focus();
      return;
    }
    button.disabled = true;
    try {
      // Any authenticated read proves the token; `token` is passed so a 401 here does not sign out.
      await getJson("/v1/jobs", { limit: 1 }, { token });
      setToken(token);
      navigate(query.get("next") || "/jobs");
    } catch (err) {
      error.textContent =
        err instanceof ApiError && err.status === 401 ? `Not signed in: ${err.message}` : err.message;
      error.hidden = false;
      input.focus();
    } finally {
      button.disabled = false;
    }
  });
  root.append(h("section", { class: "login" }, form));
  input.focus();
  return () => {};
}
