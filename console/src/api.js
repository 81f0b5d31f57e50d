// The console's only door to the cluster: the Kubernetes API on the same
// origin, as the user who signed in. Nothing here has rights of its own:
// every request carries the user's bearer token, so RBAC decides what the
// page may show exactly as it decides for kubectl.

const TOKEN_KEY = 'portal.console.token';

// Kept for the tab only: closing it forgets the credential.
export function token() {
  return globalThis.sessionStorage?.getItem(TOKEN_KEY) ?? null;
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** A Kubernetes `Status` failure (or a transport failure, code 0). */
export class ApiError extends Error {
  constructor(code, reason, message) {
    super(message || reason || `HTTP ${code}`);
    this.code = code;
    this.reason = reason || '';
  }

  get forbidden() {
    return this.code === 403;
  }
}

// Told when the server stops accepting the token (it expired, or the
// service account went): the page signs out instead of retrying forever.
export const session = { ended: () => {} };

async function failure(response) {
  const text = await response.text().catch(() => '');
  try {
    const status = JSON.parse(text);
    return new ApiError(response.status, status.reason, status.message);
  } catch {
    return new ApiError(response.status, '', text.trim() || response.statusText);
  }
}

/** A request as the signed-in user; a failure answer throws `ApiError`. */
export async function request(path, { signal, method = 'GET', body, accept = 'application/json' } = {}) {
  const headers = { Accept: accept };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method,
    headers,
    signal,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
    credentials: 'same-origin',
  });
  if (!response.ok) {
    if (response.status === 401 && bearer) session.ended();
    throw await failure(response);
  }
  return response;
}

export async function getJSON(path, options) {
  return (await request(path, options)).json();
}

/** Who the server thinks we are (`kubectl auth whoami`). */
export async function whoami() {
  const review = await getJSON('/apis/authentication.k8s.io/v1/selfsubjectreviews', {
    method: 'POST',
    body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
  });
  return review.status?.userInfo ?? {};
}

/** The lines of a streamed answer (a watch, a followed log), as they come. */
export async function* lines(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = pending.indexOf('\n')) >= 0) {
      yield pending.slice(0, newline);
      pending = pending.slice(newline + 1);
    }
  }
  pending += decoder.decode();
  if (pending) yield pending;
}

/** A collection's path, cluster-wide (`namespace` empty) or in one namespace. */
export function collectionPath(prefix, resource, namespace) {
  return namespace ? `${prefix}/namespaces/${encodeURIComponent(namespace)}/${resource}` : `${prefix}/${resource}`;
}
