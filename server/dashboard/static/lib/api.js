// The API client of the dashboard: every call carries the signed-in token as a Bearer header and
// every failure becomes an ApiError built from the server's envelope
// `{"error": {"type", "code", "message", "param"}}`, so views show one kind of error.

const TOKEN_KEY = "twinkle.apiToken";

export function getToken() {
  return localStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  localStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  localStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, { type = "api_error", code = "unknown", message, param = null } = {}) {
    super(message || `request failed with HTTP ${status}`);
    this.status = status;
    this.type = type;
    this.code = code;
    this.param = param;
  }
}

// Called once per 401 so the app can drop the token and show the sign-in page.
let unauthorizedHandler = () => {};
export function onUnauthorized(handler) {
  unauthorizedHandler = handler;
}

export function authHeaders(token = getToken()) {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    // Arrays repeat the key (`status=a&status=b`), as FastAPI reads list query parameters.
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item !== undefined && item !== null && item !== "") query.append(key, String(item));
    }
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

async function errorFrom(response) {
  let envelope = null;
  try {
    envelope = (await response.json()).error;
  } catch {
    // Not our JSON envelope (a proxy's HTML page, an empty body): fall back to the status line.
  }
  return new ApiError(response.status, envelope || { message: `${response.status} ${response.statusText}` });
}

/** fetch() with the token; resolves to the Response when it is 2xx, throws ApiError otherwise. */
export async function request(path, { method = "GET", params, body, headers = {}, signal, token } = {}) {
  const init = { method, signal, headers: { ...authHeaders(token), ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(withQuery(path, params), init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, { code: "network_error", message: "cannot reach the server" });
  }
  if (!response.ok) {
    const error = await errorFrom(response);
    if (response.status === 401 && token === undefined) unauthorizedHandler(error);
    throw error;
  }
  return response;
}

export async function getJson(path, params, options = {}) {
  return (await request(path, { ...options, params })).json();
}

export async function postJson(path, body = {}, options = {}) {
  const response = await request(path, { ...options, method: "POST", body });
  return response.status === 204 ? null : response.json();
}

/** Download `path` with the auth header (a plain link cannot send it) and save it as a file. */
export async function downloadFile(path, fallbackName) {
  const response = await request(path);
  const blob = await response.blob();
  const disposition = response.headers.get("Content-Disposition") || "";
  const match = /filename\*?=(?:UTF-8'')?"?([^";]+)"?/i.exec(disposition);
  const name = match ? decodeURIComponent(match[1]) : fallbackName;
  const url = URL.createObjectURL(blob);
  const link = Object.assign(document.createElement("a"), { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  // Revoke later: revoking at once can cancel the download in some browsers.
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  return { name, size: blob.size };
}
