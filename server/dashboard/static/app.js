// The dashboard's entry point: a hash router (`#/jobs`, `#/jobs/<id>`, `#/new`, `#/workers`,
// `#/login`) that mounts one view at a time. A view's mount() returns a cleanup function that
// stops its pollers and streams, so leaving a page never leaves requests running behind it.

import { clearToken, getToken, onUnauthorized } from "./lib/api.js";
import { errorBox, toast } from "./lib/ui.js";
import * as jobDetail from "./views/job.js";
import * as jobs from "./views/jobs.js";
import * as login from "./views/login.js";
import * as submit from "./views/submit.js";
import * as workers from "./views/workers.js";

const ROUTES = [
  { pattern: /^\/jobs\/([^/]+)$/, view: jobDetail, nav: "jobs", keys: ["id"] },
  { pattern: /^\/jobs\/?$/, view: jobs, nav: "jobs", keys: [] },
  { pattern: /^\/new\/?$/, view: submit, nav: "new", keys: [] },
  { pattern: /^\/workers\/?$/, view: workers, nav: "workers", keys: [] },
  { pattern: /^\/login\/?$/, view: login, nav: null, keys: [], public: true },
];

const main = document.getElementById("main");
let cleanup = () => {};
let generation = 0;

export function navigate(path) {
  if (location.hash === `#${path}`) route();
  else location.hash = path;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/jobs";
  const [path, queryString = ""] = raw.split("?");
  return { path, query: new URLSearchParams(queryString) };
}

function updateChrome(nav) {
  const signedIn = Boolean(getToken());
  document.querySelector(".nav").hidden = !signedIn;
  document.querySelector(".session").hidden = !signedIn;
  const token = getToken() || "";
  document.querySelector(".token-hint").textContent = token ? `token …${token.slice(-4)}` : "";
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function route() {
  const { path, query } = parseHash();
  const match = ROUTES.map((r) => ({ r, m: r.pattern.exec(path) })).find(({ m }) => m);
  if (!match) return navigate("/jobs");
  const { r, m } = match;
  if (!r.public && !getToken()) {
    const next = `${path}${query.toString() ? `?${query}` : ""}`;
    return navigate(`/login?next=${encodeURIComponent(next)}`);
  }
  cleanup();
  cleanup = () => {};
  const mine = ++generation;
  updateChrome(r.nav);
  const params = Object.fromEntries(r.keys.map((key, i) => [key, decodeURIComponent(m[i + 1])]));
  // Each route mounts into an element of its own: a mount still awaiting its data when the user
  // (or a second hashchange) moves on then fills a detached element, not the page. Mounting into
  // `main` itself let a stale job page add its buttons beside the current one's.
  const root = document.createElement("div");
  main.replaceChildren(root);
  main.setAttribute("aria-busy", "true");
  try {
    const stop = await r.view.mount(root, { params, query, navigate });
    // A slow mount may finish after the user moved on: stop it at once.
    if (mine !== generation) stop?.();
    else cleanup = stop || (() => {});
  } catch (err) {
    if (mine === generation) main.replaceChildren(errorBox(err, "This page could not be loaded"));
  } finally {
    if (mine === generation) main.removeAttribute("aria-busy");
  }
}

function signOut(message) {
  clearToken();
  cleanup();
  cleanup = () => {};
  if (message) toast(message, "error");
  navigate("/login");
}

onUnauthorized((error) => {
  if (getToken()) signOut(`Signed out: ${error.message}`);
});
document.getElementById("sign-out").addEventListener("click", () => signOut());
window.addEventListener("hashchange", route);
route();
