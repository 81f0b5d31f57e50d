// Live collections: list once, then follow the watch from the list's
// resourceVersion, as client-go's reflector does. A watch that ends (the
// server's timeout) resumes where it stopped; one that is too old (410
// Gone) lists again; other failures are reported and retried with backoff.

import { ApiError, getJSON, lines, request } from './api.js';

const MAX_BACKOFF_MS = 10_000;

function objectKey(object) {
  const { namespace = '', name } = object.metadata;
  return `${namespace}/${name}`;
}

// A watch that ends sooner than this is resumed only after a pause: a
// server (or proxy) that closes watches at once must not make a busy loop.
const SHORTEST_WATCH_MS = 1000;

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });

/**
 * Follows the collection at `path`. `onChange(objects)` gets an array of the
 * current objects after the list and after each burst of events (bursts are
 * delivered at most every `batchMs`); `onError(error or null)` says whether
 * the collection is current. Returns a function that stops following.
 */
export function follow(path, { onChange, onError = () => {}, batchMs = 100 }) {
  const controller = new AbortController();
  const { signal } = controller;
  const objects = new Map();
  let timer = null;
  const publish = () => {
    timer = null;
    if (!signal.aborted) onChange([...objects.values()]);
  };
  const soon = () => {
    timer ??= setTimeout(publish, batchMs);
  };

  (async () => {
    let backoff = 500;
    // Failures since the last good list: a connection that drops once (the
    // browser closes its sockets when the machine's network changes) is
    // mended without a word; one that keeps failing is reported.
    let failures = 0;
    while (!signal.aborted) {
      try {
        const list = await getJSON(path, { signal });
        objects.clear();
        for (const item of list.items ?? []) objects.set(objectKey(item), item);
        publish();
        onError(null);
        failures = 0;
        let version = list.metadata?.resourceVersion ?? '';
        const separator = path.includes('?') ? '&' : '?';
        for (;;) {
          const began = Date.now();
          const watch = `${path}${separator}watch=1&allowWatchBookmarks=true&timeoutSeconds=240&resourceVersion=${encodeURIComponent(version)}`;
          const response = await request(watch, { signal });
          for await (const line of lines(response)) {
            if (!line.trim()) continue;
            const event = JSON.parse(line);
            if (event.type === 'ERROR') {
              const status = event.object ?? {};
              throw new ApiError(status.code ?? 500, status.reason, status.message);
            }
            version = event.object?.metadata?.resourceVersion ?? version;
            if (event.type === 'BOOKMARK') continue;
            if (event.type === 'DELETED') objects.delete(objectKey(event.object));
            else objects.set(objectKey(event.object), event.object);
            soon();
          }
          // A watch that ran its course: the next failure starts afresh.
          if (Date.now() - began >= SHORTEST_WATCH_MS) backoff = 500;
          else await sleep(SHORTEST_WATCH_MS, signal);
          if (signal.aborted) return;
        }
      } catch (error) {
        if (signal.aborted) return;
        // Too old to resume: the next round lists afresh (at once the first
        // time; with the backoff if it keeps happening).
        const gone = error instanceof ApiError && error.code === 410;
        if (gone && backoff === 500) {
          backoff = 1000;
          continue;
        }
        failures += 1;
        const dropped = !(error instanceof ApiError) || error.code === 0;
        if (!gone && !(dropped && failures === 1)) {
          onError(error instanceof ApiError ? error : new ApiError(0, '', String(error.message ?? error)));
        }
        await sleep(backoff, signal);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      }
    }
  })();

  return () => {
    controller.abort();
    if (timer) clearTimeout(timer);
  };
}
