// request.js: the one way labkeep's pages (portal.js, admin.js) send a
// request to the API: the bearer token in the Authorization header, no
// cache, no cookies, no redirects. When the network fails under a request
// (the browser drops requests in flight when the machine's network
// changes) it is sent again, up to 3 times with a growing pause, if that
// is safe: reads always, a change only if the caller says so (again).
// Answers { res, data, received }: the response, its JSON body (null when
// the body is not JSON) and when the answer arrived (performance.now(),
// taken before the body is read, so a countdown anchored on it loses no
// reading time); or, when no answer came, { offline: the reason,
// received }. labkeepErrorText is the one wording of a failed answer.
"use strict";

window.labkeepRequest = async function (url, method, token, body, again) {
  const headers = { Authorization: "Bearer " + token };
  const init = { method: method, headers: headers, cache: "no-store", credentials: "omit", redirect: "error" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  for (let attempt = 1; ; attempt++) {
    let res;
    try {
      res = await fetch(url, init);
    } catch (e) {
      if ((method !== "GET" && !again) || attempt === 3) {
        return { offline: String(e), received: performance.now() };
      }
      await new Promise((resolve) => window.setTimeout(resolve, 500 * attempt));
      continue;
    }
    const received = performance.now();
    let data = null;
    try {
      data = await res.json();
    } catch (e) {
      data = null;
    }
    return { res: res, data: data, received: received };
  }
};

// labkeepErrorText is the server's message for a failed answer r
// ({ status, data } or { offline }): the error's own sentence, else the
// status, or why labkeep could not be reached.
window.labkeepErrorText = function (r) {
  if (r.offline) return "cannot reach labkeep: " + r.offline;
  const err = r.data && r.data.error;
  return err ? err.message : "labkeep answered " + r.status;
};
