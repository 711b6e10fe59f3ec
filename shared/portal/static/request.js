// request.js: the one way labkeep's pages (portal.js, admin.js) send a
// request to the API: the bearer token in the Authorization header, no
// cache, no cookies, no redirects. When the network fails under a request
// (the browser drops requests in flight when the machine's network
// changes) it is sent again, up to 3 times with a growing pause, if that
// is safe: reads always, a change only if the caller says so (again).
// Answers { res } or, when no answer came, { offline: the reason }.
"use strict";

window.labkeepRequest = async function (url, method, token, body, again) {
  const headers = { Authorization: "Bearer " + token };
  const init = { method: method, headers: headers, cache: "no-store", credentials: "omit", redirect: "error" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  for (let attempt = 1; ; attempt++) {
    try {
      return { res: await fetch(url, init) };
    } catch (e) {
      if ((method !== "GET" && !again) || attempt === 3) {
        return { offline: String(e) };
      }
      await new Promise((resolve) => window.setTimeout(resolve, 500 * attempt));
    }
  }
};
