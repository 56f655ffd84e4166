(function () {
  "use strict";
  function setAll(open) {
    document.querySelectorAll("details.patch-diff, details.range-entry").forEach(function (d) {
      d.open = open;
    });
  }
  function openFromHash() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    var section = id && document.getElementById(id);
    var details = section && section.querySelector("details.patch-diff");
    if (details) { details.open = true; }
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-action]").forEach(function (button) {
      button.hidden = false;
      button.addEventListener("click", function () {
        setAll(button.getAttribute("data-action") === "expand-all");
      });
    });
    window.addEventListener("hashchange", openFromHash);
    openFromHash();
  });
})();
