/* The storefront's only script: every page works without it.
 *
 * - A submit button disables itself on the first click, so a double click sends the
 *   form once (the server half: request keys and cart versions make a second send
 *   harmless anyway). It is disabled just after the browser has taken the form's
 *   data, so the clicked button's own name and value are still sent.
 * - Buttons come back when the page is shown again from the back/forward cache.
 * - A [data-countdown] element counts down to its time (the reservation's expiry).
 */
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (event.defaultPrevented || form.hasAttribute("data-no-disable")) return;
    if (form.dataset.sending === "1") {
      event.preventDefault();
      return;
    }
    form.dataset.sending = "1";
    var buttons = form.querySelectorAll("button[type=submit], button:not([type]), input[type=submit]");
    window.setTimeout(function () {
      buttons.forEach(function (button) {
        button.disabled = true;
        button.setAttribute("aria-disabled", "true");
      });
    }, 0);
  });

  window.addEventListener("pageshow", function (event) {
    if (!event.persisted) return;
    document.querySelectorAll("form[data-sending]").forEach(function (form) {
      delete form.dataset.sending;
      form.querySelectorAll("[aria-disabled=true]").forEach(function (button) {
        button.disabled = false;
        button.removeAttribute("aria-disabled");
      });
    });
  });

  function countdown(element) {
    var end = Date.parse(element.getAttribute("data-countdown"));
    if (isNaN(end)) return;
    function tick() {
      var left = Math.max(0, Math.round((end - Date.now()) / 1000));
      if (left === 0) {
        element.textContent = " (time is up: reload the page to see the order's status)";
        return;
      }
      var minutes = Math.floor(left / 60);
      var seconds = left % 60;
      element.textContent = " (" + minutes + " min " + (seconds < 10 ? "0" : "") + seconds + " s left)";
      window.setTimeout(tick, 1000);
    }
    tick();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-countdown]").forEach(countdown);
  });
})();
