// Berth's page follows the log: the dispatcher sends the live part of the
// page as server-sent events whenever a fact arrives. Without script the
// page refreshes itself instead (see the <noscript> refresh).
(function () {
  var main = document.getElementById("live");
  var state = document.getElementById("conn");
  if (!main || !window.EventSource) { return; }
  var es = new EventSource("live");
  es.onopen = function () { state.textContent = "live"; state.className = "ok"; };
  es.onerror = function () { state.textContent = "reconnecting…"; state.className = "warn"; };
  es.onmessage = function (e) { main.innerHTML = e.data; };
})();
